#include "runtime/comm/reducer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/base/errors.h"
#include "support/thread_world.h"

namespace lockstep {
namespace {

// Two ranks with different local gradient sums and counts: afterwards both
// hold (sum over ranks) / (total count), bucket by bucket.
TEST(GradientReducer, MeanOverTheGlobalCountInSeveralBuckets) {
  const std::vector<double> counts = {3, 5};
  std::vector<std::vector<at::Tensor>> results(2);
  std::vector<int64_t> buckets(2);
  testing::run_ranks(2, [&](int rank, StorePtr store) {
    auto group = CollectiveGroup::gloo(prefixed("data/", store), rank, 2, std::chrono::seconds(30),
                                       {"127.0.0.1"});
    std::vector<std::pair<std::string, at::Tensor>> params;
    for (int i = 0; i < 4; ++i) {
      auto p = torch::zeros({300}, torch::requires_grad());
      if (i != 2) p.mutable_grad() = torch::full({300}, double(rank + 1) * (i + 1));  // 2: unused
      params.emplace_back("p" + std::to_string(i), p);
    }
    ReducerOptions options;
    options.bucket_bytes = 2 * 300 * 4;  // two parameters per bucket
    options.first_bucket_bytes = 300 * 4;
    options.overlap = false;
    GradientReducer reducer(params, *group, options);
    double global = reducer.allreduce_mean(counts[size_t(rank)]);
    EXPECT_EQ(global, 8);
    EXPECT_EQ(reducer.collectives_last_step(), 1);  // three buckets, all ready: one all-reduce
    buckets[size_t(rank)] = reducer.bucket_count();
    for (auto& [name, p] : params) results[size_t(rank)].push_back(p.grad().clone());
  });
  EXPECT_EQ(buckets[0], 3);  // 1 small first bucket, then two of two
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 4; ++i) {
      double expected = i == 2 ? 0.0 : (1 + 2) * (i + 1) / 8.0;
      EXPECT_NEAR(results[r][size_t(i)].max().item<double>(), expected, 1e-6) << "p" << i;
      EXPECT_NEAR(results[r][size_t(i)].min().item<double>(), expected, 1e-6) << "p" << i;
    }
  }
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

// With overlap, buckets start during backward (hooks), in index order, and
// the result equals the plain path: identical bits on every rank.
TEST(GradientReducer, OverlapStartsBucketsDuringBackwardAndMatchesThePlainPath) {
  std::vector<std::vector<at::Tensor>> overlapped(2), plain(2);
  std::vector<int64_t> early(2);
  testing::run_ranks(2, [&](int rank, StorePtr store) {
    auto group = CollectiveGroup::gloo(prefixed("data/", store), rank, 2, std::chrono::seconds(30),
                                       {"127.0.0.1"});
    for (bool overlap : {true, false}) {
      // Threads share LibTorch's default generator: each rank uses its own.
      auto init = at::make_generator<at::CPUGeneratorImpl>(3);
      auto data = at::make_generator<at::CPUGeneratorImpl>(10 + rank);  // each rank its own data
      torch::nn::Sequential net(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                                torch::nn::Linear(64, 64), torch::nn::ReLU(),
                                torch::nn::Linear(64, 4));
      std::vector<std::pair<std::string, at::Tensor>> params;
      for (const auto& item : net->named_parameters()) {
        torch::NoGradGuard no_grad;
        item.value().copy_(at::normal(0.0, 0.2, item.value().sizes(), init));
        params.emplace_back(item.key(), item.value());
      }
      ReducerOptions options;
      options.bucket_bytes = 64 * 64 * 4;  // several buckets
      options.first_bucket_bytes = 4 * 64 * 4;
      options.overlap = overlap;
      GradientReducer reducer(params, *group, options);
      for (int micro = 0; micro < 2; ++micro) {  // accumulation of two microbatches
        reducer.begin_microbatch(micro, 2, 8.0);
        net->forward(at::normal(0.0, 1.0, {8, 32}, data)).pow(2).sum().backward();
      }
      EXPECT_EQ(reducer.finish(), 32.0);
      if (overlap) early[size_t(rank)] = reducer.launched_during_backward();
      for (auto& [name, p] : params)
        (overlap ? overlapped : plain)[size_t(rank)].push_back(p.grad().clone());
    }
  });
  EXPECT_GT(early[0], 1);
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < overlapped[0].size(); ++i) {
      EXPECT_TRUE(overlapped[r][i].equal(overlapped[0][i])) << "rank " << r << " tensor " << i;
      EXPECT_TRUE(overlapped[r][i].allclose(plain[r][i], 1e-6, 1e-7))
          << "tensor " << i << ": overlap sum " << overlapped[r][i].sum().item<double>()
          << ", plain sum " << plain[r][i].sum().item<double>();
    }
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

// A model whose forward skips `fc_b` on rank 1 only.
struct TwoBranch {
  torch::nn::Linear fc_a{8, 4}, fc_b{8, 4};
  std::vector<std::pair<std::string, at::Tensor>> params() {
    return {{"fc_a.weight", fc_a->weight}, {"fc_a.bias", fc_a->bias},
            {"fc_b.weight", fc_b->weight}, {"fc_b.bias", fc_b->bias}};
  }
  at::Tensor forward(const at::Tensor& x, bool use_b) {
    return use_b ? fc_a->forward(x) + fc_b->forward(x) : fc_a->forward(x);
  }
};

// Autograd accumulates straight into the buckets: the .grad tensors are
// slices of the reducer's buffers, the same ones every step, and the mean is
// taken there (no second copy of the gradients).
TEST(GradientReducer, GradientsAreViewsOfTheBucketsAcrossSteps) {
  testing::run_ranks(2, [&](int rank, StorePtr store) {
    auto group = CollectiveGroup::gloo(prefixed("data/", store), rank, 2, std::chrono::seconds(30),
                                       {"127.0.0.1"});
    TwoBranch net;
    auto params = net.params();
    ReducerOptions options;
    options.first_bucket_bytes = options.bucket_bytes = 1 << 20;  // one bucket
    GradientReducer reducer(params, *group, options);
    std::vector<const void*> first;
    for (int step = 0; step < 3; ++step) {
      reducer.begin_microbatch(0, 1, 2);
      net.forward(torch::ones({2, 8}), true).sum().backward();
      EXPECT_EQ(reducer.finish(), 4.0);
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& grad = params[i].second.grad();
        if (step == 0) first.push_back(grad.data_ptr());
        EXPECT_EQ(grad.data_ptr(), first[i]) << params[i].first << " step " << step;
        EXPECT_TRUE(grad.storage().is_alias_of(params[0].second.grad().storage()));
      }
      // d/dW sum(W x + b) over 2 rows of ones: 2 per rank, 4 summed, 4 samples.
      EXPECT_NEAR(params[0].second.grad().max().item<double>(), 1.0, 1e-6);
      EXPECT_NEAR(params[0].second.grad().min().item<double>(), 1.0, 1e-6);
    }
  });
}

// A parameter that gets no gradient on one rank: both ranks finish their
// collectives (no hang) and both stop with an error; the rank that skipped
// it names it. With unused parameters allowed, it counts as zeros.
TEST(GradientReducer, AParameterWithoutGradientIsAnErrorOnEveryRankNotAHang) {
  std::vector<std::string> errors(2);
  std::vector<at::Tensor> allowed(2);
  testing::run_ranks(2, [&](int rank, StorePtr store) {
    auto group = CollectiveGroup::gloo(prefixed("data/", store), rank, 2, std::chrono::seconds(30),
                                       {"127.0.0.1"});
    for (bool error_on_unused : {true, false}) {
      TwoBranch net;
      auto params = net.params();
      ReducerOptions options;
      options.bucket_bytes = options.first_bucket_bytes = 4 * 4 * 4;  // several buckets
      options.error_on_unused = error_on_unused;
      GradientReducer reducer(params, *group, options);
      reducer.begin_microbatch(0, 1, 1);
      net.forward(torch::ones({1, 8}), /*use_b=*/rank == 0).sum().backward();
      try {
        reducer.finish();
        if (!error_on_unused) allowed[size_t(rank)] = params[2].second.grad().clone();
      } catch (const RunError& e) {
        if (error_on_unused) errors[size_t(rank)] = e.what();
      }
    }
  });
  EXPECT_NE(errors[1].find("rank 1: fc_b.weight, fc_b.bias"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("comm.unused_parameters"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("1 of 2 ranks got no gradient"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank 0: none"), std::string::npos) << errors[0];
  // Allowed: rank 0's gradient 1 per element, rank 1's zeros, over 2 samples.
  ASSERT_TRUE(allowed[0].defined() && allowed[1].defined());
  EXPECT_TRUE(allowed[0].equal(allowed[1]));
  EXPECT_NEAR(allowed[0].max().item<double>(), 0.5, 1e-6);
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

// comm.summation = exact: eight microbatches' gradients, spread over 1, 2
// and 4 ranks in contiguous blocks, give the same bits, step after step,
// also when a step's magnitudes jump by 10^6 (a new grid: a second round
// for that bucket) and when they span nine orders of magnitude within a
// bucket; every value is within fp32 rounding of the fp64 sum.
TEST(GradientReducer, ExactSumsAreTheSameBitsOnOneTwoAndFourRanksAndFollowFp64) {
  constexpr int kMicrobatches = 8, kSteps = 4;
  const std::vector<int64_t> sizes = {5000, 300, 40};
  // gradients[step][micro][param], fp32, from a fixed generator.
  std::vector<std::vector<std::vector<at::Tensor>>> gradients(kSteps);
  {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
    for (int step = 0; step < kSteps; ++step)
      for (int micro = 0; micro < kMicrobatches; ++micro) {
        gradients[size_t(step)].emplace_back();
        for (int64_t size : sizes) {
          const double scale = step == 2 ? 1e6 : 1.0;  // a jump: every bucket leaves its grid
          at::Tensor g = at::normal(0.0, 1.0, {size}, generator) *
                         at::pow(10.0, at::rand({size}, generator) * 9 - 8) * scale;
          gradients[size_t(step)].back().push_back(g.to(at::kFloat));
        }
      }
  }
  auto reduce_on = [&](int world, std::vector<int64_t>* regrids) {
    std::vector<std::vector<at::Tensor>> by_step(kSteps);  // rank 0's results
    testing::run_ranks(world, [&](int rank, StorePtr store) {
      auto group = CollectiveGroup::gloo(prefixed("data/", store), rank, world, std::chrono::seconds(30),
                                         {"127.0.0.1"});
      std::vector<std::pair<std::string, at::Tensor>> params;
      for (size_t i = 0; i < sizes.size(); ++i)
        params.emplace_back("p" + std::to_string(i), torch::zeros({sizes[i]}, torch::requires_grad()));
      ReducerOptions options;
      options.exact = true;
      options.microbatches_per_step = kMicrobatches;
      options.bucket_bytes = 400 * 4;  // p0 alone; p1 and p2 together
      options.first_bucket_bytes = 400 * 4;
      GradientReducer reducer(params, *group, options);
      const int per_rank = kMicrobatches / world;
      for (int step = 0; step < kSteps; ++step) {
        for (int local = 0; local < per_rank; ++local) {
          const int micro = rank * per_rank + local;
          reducer.begin_microbatch(local, per_rank, 1.0, 0.5 * micro, 1.0);
          at::Tensor loss = torch::zeros({});
          for (size_t i = 0; i < sizes.size(); ++i)
            loss = loss + (params[i].second * gradients[size_t(step)][size_t(micro)][i]).sum();
          loss.backward();
          reducer.end_microbatch();
        }
        EXPECT_EQ(reducer.finish(), double(kMicrobatches));
        EXPECT_EQ(reducer.global_loss_sum(), 0.5 * (kMicrobatches - 1) * kMicrobatches / 2);
        if (rank == 0)
          for (auto& [name, p] : params) by_step[size_t(step)].push_back(p.grad().clone());
      }
      if (rank == 0) regrids->push_back(reducer.regrids());
    });
    return by_step;
  };
  std::vector<int64_t> regrids;
  const auto one = reduce_on(1, &regrids), two = reduce_on(2, &regrids), four = reduce_on(4, &regrids);
  EXPECT_EQ(regrids, (std::vector<int64_t>{regrids[0], regrids[0], regrids[0]}));
  EXPECT_GE(regrids[0], 2);  // the first step and the jump at least
  double worst = 0;
  for (int step = 0; step < kSteps; ++step)
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_TRUE(torch::equal(one[size_t(step)][i], two[size_t(step)][i])) << "step " << step << " p" << i;
      EXPECT_TRUE(torch::equal(one[size_t(step)][i], four[size_t(step)][i])) << "step " << step << " p" << i;
      at::Tensor reference = torch::zeros({sizes[i]}, torch::kDouble);
      for (int micro = 0; micro < kMicrobatches; ++micro)
        reference += gradients[size_t(step)][size_t(micro)][i].to(torch::kDouble);
      reference /= kMicrobatches;
      // Relative to each value, for values above 2^-30 of the largest (below
      // that the shared grid, not fp32, sets the precision).
      const double floor = reference.abs().max().item<double>() * std::ldexp(1.0, -30);
      const at::Tensor error = (one[size_t(step)][i].to(torch::kDouble) - reference).abs() /
                               reference.abs().clamp_min(floor);
      worst = std::max(worst, error.max().item<double>());
    }
  std::printf("largest relative error against the fp64 sum: %.3g (fp32 rounding: %.3g)\n", worst,
              std::ldexp(1.0, -24));
  EXPECT_LE(worst, 1.5 * std::ldexp(1.0, -24));
}

}  // namespace
}  // namespace lockstep

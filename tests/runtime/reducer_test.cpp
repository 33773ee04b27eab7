#include "runtime/reducer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

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
                                       "127.0.0.1");
    std::vector<std::pair<std::string, at::Tensor>> params;
    for (int i = 0; i < 4; ++i) {
      auto p = torch::zeros({300}, torch::requires_grad());
      if (i != 2) p.mutable_grad() = torch::full({300}, double(rank + 1) * (i + 1));  // 2: unused
      params.emplace_back("p" + std::to_string(i), p);
    }
    ReducerOptions options;
    options.bucket_bytes = 2 * 300 * 4;  // two parameters per bucket
    options.first_bucket_bytes = 300 * 4;
    GradientReducer reducer(params, *group, options);
    double global = reducer.allreduce_mean(counts[size_t(rank)]);
    EXPECT_EQ(global, 8);
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

// Benchmark: the accuracy of the gradient sum, exact against float, against
// an fp64 reference. Eight microbatches of fp32 gradients whose magnitudes
// span nine orders of magnitude within each bucket (as a model's do), summed
// by the real GradientReducer over real Gloo groups of 1, 2 and 4 ranks
// (threads of this process) in contiguous blocks, for several steps (one
// with a jump of 10^6). Prints, per summation and world size, the largest
// and median relative error of every value above 2^-30 of its bucket's
// largest, whether the bits equal the one-rank result, and the bytes each
// rank hands to the all-reduce per step. JSON on stdout.
// Usage: summation_error [elements]
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "runtime/comm/reducer.h"
#include "support/thread_world.h"

namespace lockstep {
namespace {

constexpr int kMicrobatches = 8, kSteps = 4;

using Gradients = std::vector<std::vector<at::Tensor>>;  // [step][micro], fp32

Gradients make_gradients(int64_t elements) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  Gradients out(kSteps);
  for (int step = 0; step < kSteps; ++step)
    for (int micro = 0; micro < kMicrobatches; ++micro) {
      const double scale = step == 2 ? 1e6 : 1.0;
      out[size_t(step)].push_back((at::normal(0.0, 1.0, {elements}, generator) *
                                   at::pow(10.0, at::rand({elements}, generator) * 9 - 8) * scale)
                                      .to(at::kFloat));
    }
  return out;
}

struct Summed {
  std::vector<at::Tensor> by_step;  // rank 0's mean gradient per step
  int64_t bytes_per_step = 0;
};

Summed reduce(const Gradients& gradients, int world, bool exact) {
  const int64_t elements = gradients[0][0].numel();
  Summed out;
  out.by_step.resize(kSteps);
  testing::run_ranks(world, [&](int rank, StorePtr store) {
    auto group = CollectiveGroup::gloo(prefixed("data/", store), rank, world, std::chrono::seconds(60), {"127.0.0.1"});
    std::vector<std::pair<std::string, at::Tensor>> params;
    for (int p = 0; p < 4; ++p)  // four buckets
      params.emplace_back("p" + std::to_string(p), torch::zeros({elements / 4}, torch::requires_grad()));
    ReducerOptions options;
    options.exact = exact;
    options.microbatches_per_step = kMicrobatches;
    options.bucket_bytes = (elements / 4) * 4;
    options.first_bucket_bytes = options.bucket_bytes;
    GradientReducer reducer(params, *group, options);
    const int per_rank = kMicrobatches / world;
    for (int step = 0; step < kSteps; ++step) {
      for (int local = 0; local < per_rank; ++local) {
        const at::Tensor& g = gradients[size_t(step)][size_t(rank * per_rank + local)];
        reducer.begin_microbatch(local, per_rank, 1.0);
        at::Tensor loss = torch::zeros({});
        for (int p = 0; p < 4; ++p) loss = loss + (params[size_t(p)].second * g.narrow(0, p * (elements / 4), elements / 4)).sum();
        loss.backward();
        reducer.end_microbatch();
      }
      reducer.finish();
      if (rank == 0) {  // in registration order (the reducer's buffer holds them in bucket order)
        std::vector<at::Tensor> grads;
        for (auto& [name, p] : params) grads.push_back(p.grad().reshape({-1}));
        out.by_step[size_t(step)] = torch::cat(grads);
      }
    }
    if (rank == 0) out.bytes_per_step = reducer.bytes_reduced() / kSteps;
  });
  return out;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  using namespace lockstep;
  const int64_t elements = argc > 1 ? std::atoll(argv[1]) / 4 * 4 : 400000;
  at::set_num_threads(1);
  const Gradients gradients = make_gradients(elements);
  std::vector<at::Tensor> reference;
  for (int step = 0; step < kSteps; ++step) {
    at::Tensor sum = torch::zeros({elements}, torch::kDouble);
    for (const auto& g : gradients[size_t(step)]) sum += g.to(torch::kDouble);
    reference.push_back(sum / kMicrobatches);
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const bool exact : {true, false}) {
    std::vector<at::Tensor> one_rank;
    for (const int world : {1, 2, 4}) {
      const Summed summed = reduce(gradients, world, exact);
      if (world == 1) one_rank = summed.by_step;
      double largest = 0;
      std::vector<at::Tensor> errors;
      bool identical = true;
      for (int step = 0; step < kSteps; ++step) {
        identical &= torch::equal(summed.by_step[size_t(step)], one_rank[size_t(step)]);
        for (int p = 0; p < 4; ++p) {
          const at::Tensor want = reference[size_t(step)].narrow(0, p * (elements / 4), elements / 4);
          const at::Tensor got = summed.by_step[size_t(step)].narrow(0, p * (elements / 4), elements / 4).to(torch::kDouble);
          const double floor = want.abs().max().item<double>() * std::ldexp(1.0, -30);
          const at::Tensor error = ((got - want).abs() / want.abs()).masked_select(want.abs() > floor);
          largest = std::max(largest, error.max().item<double>());
          errors.push_back(error);
        }
      }
      const double median = torch::cat(errors).median().item<double>();
      std::fprintf(stderr, "%-5s %d rank(s): largest relative error %.3g, median %.3g, %s the one-rank bits, "
                   "%lld bytes per rank per step\n", exact ? "exact" : "float", world, largest, median,
                   identical ? "equal to" : "differ from", static_cast<long long>(summed.bytes_per_step));
      rows.push_back({{"summation", exact ? "exact" : "float"}, {"ranks", world},
                      {"largest_relative_error", largest}, {"median_relative_error", median},
                      {"bits_equal_one_rank", identical}, {"allreduce_bytes_per_rank_per_step", summed.bytes_per_step}});
    }
  }
  nlohmann::json out = {
      {"benchmark", "summation_error"},
      {"setup", {{"elements", elements}, {"buckets", 4}, {"microbatches", kMicrobatches}, {"steps", kSteps},
                 {"values", "fp32, normal x 10^U(-8, 1); step 3 scaled by 10^6"},
                 {"reference", "fp64 sum of the same fp32 values, / 8"},
                 {"error", "|sum - reference| / |reference| for values above 2^-30 of their bucket's largest"},
                 {"fp32_unit_roundoff", std::ldexp(1.0, -24)},
                 {"cores", std::thread::hardware_concurrency()}}},
      {"results", rows}};
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}

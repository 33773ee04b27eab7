// Benchmark: gradient-sync efficiency. Two ranks (threads of this process,
// each with its own Gloo group over a real TCPStore on loopback) all-reduce
// the cnn's gradients through lockstep's bucketed reducer, and the same
// number of bytes as one flat all-reduce, interleaved. Prints JSON: the
// medians and flat / bucketed (1.0 = no cost for bucketing).
// Usage: sync_efficiency [repetitions=200]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "runtime/models.h"
#include "runtime/process_group.h"
#include "runtime/reducer.h"

using namespace lockstep;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::max(10, std::atoi(argv[1])) : 200;
  at::set_num_threads(1);
  StorePtr server = open_tcp_store("127.0.0.1", 0, true, 2, std::chrono::seconds(30));
  const int port = store_port(server);
  std::vector<double> bucketed_ms, flat_ms;
  int64_t elements = 0, buckets = 0;
  auto rank_main = [&](int rank) {
    StorePtr store = open_tcp_store("127.0.0.1", port, false, 2, std::chrono::seconds(30));
    auto group = CollectiveGroup::gloo(prefixed("data/", store), rank, 2, std::chrono::seconds(60),
                                       "127.0.0.1");
    ModelSection section;
    section.name = "cnn";
    auto model = ModelRegistry::with_builtins().build(section);
    std::vector<std::pair<std::string, at::Tensor>> params;
    auto generator = at::make_generator<at::CPUGeneratorImpl>(rank + 1);
    int64_t total = 0;
    for (const auto& item : model->named_parameters()) {
      params.emplace_back(item.key(), item.value());
      item.value().mutable_grad() = at::normal(0.0, 1.0, item.value().sizes(), generator);
      total += item.value().numel();
    }
    ReducerOptions options;
    options.overlap = false;
    GradientReducer reducer(params, *group, options);
    std::vector<at::Tensor> flat{torch::zeros({total + 1})};
    std::vector<at::Tensor> originals;
    for (auto& [name, p] : params) originals.push_back(p.grad().clone());
    for (int i = 0; i < repetitions; ++i) {
      for (size_t k = 0; k < params.size(); ++k)  // same values every time (untimed)
        params[k].second.mutable_grad().copy_(originals[k]);
      flat[0].normal_(0.0, 1.0, generator);
      group->allreduce_sum(flat).wait();  // line the ranks up
      auto start = Clock::now();
      reducer.allreduce_mean(64);
      auto middle = Clock::now();
      group->allreduce_sum(flat).wait();
      auto end = Clock::now();
      if (rank == 0) {
        bucketed_ms.push_back(std::chrono::duration<double, std::milli>(middle - start).count());
        flat_ms.push_back(std::chrono::duration<double, std::milli>(end - middle).count());
      }
    }
    if (rank == 0) elements = total, buckets = reducer.bucket_count();
  };
  std::thread a(rank_main, 0), b(rank_main, 1);
  a.join();
  b.join();
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<double> ratio;
  for (size_t i = 0; i < flat_ms.size(); ++i) ratio.push_back(flat_ms[i] / bucketed_ms[i]);
  std::sort(ratio.begin(), ratio.end());
  nlohmann::json out = {
      {"benchmark", "sync_efficiency"},
      {"setup", {{"model", "cnn"}, {"gradient_floats", elements}, {"buckets", buckets},
                 {"ranks", 2}, {"transport", "Gloo over loopback, ranks as threads"},
                 {"repetitions", repetitions}, {"order", "interleaved per repetition"}}},
      {"bucketed_ms_median", median(bucketed_ms)},
      {"flat_ms_median", median(flat_ms)},
      {"efficiency_flat_over_bucketed", {{"median", ratio[ratio.size() / 2]},
                                         {"p10", ratio[ratio.size() / 10]},
                                         {"p90", ratio[ratio.size() * 9 / 10]}}}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

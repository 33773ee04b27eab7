// Benchmark: gradient-sync efficiency. Two ranks, each its own process (this
// program started twice) with a Gloo group over a real TCPStore on loopback,
// all-reduce the cnn's gradients through lockstep's bucketed reducer and the
// same number of bytes as one flat all-reduce, interleaved, for
// comm.bucket_mb = 1 (the example jobs) and 25 (the default), one all-reduce
// per bucket as with comm.overlap, and comm.overlap = false (everything as one
// all-reduce). The reducer's time includes everything it does: counts, the mean
// taken in place. Also the latency of a 64-byte all-reduce alone and of two
// in a row (what each extra bucket costs on this machine). Prints JSON: medians and
// flat / bucketed (1.0 = bucketing costs nothing).
// Usage: sync_efficiency [repetitions=200]
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <cstdio>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "runtime/model/models.h"
#include "runtime/comm/process_group.h"
#include "runtime/comm/reducer.h"

extern char** environ;

using namespace lockstep;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

nlohmann::json spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {{"median", v[v.size() / 2]}, {"p10", v[v.size() / 10]}, {"p90", v[v.size() * 9 / 10]}};
}

// A cnn whose gradients are fixed random values, and its reducer.
struct Replica {
  std::shared_ptr<Model> model;
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::unique_ptr<GradientReducer> reducer;
  std::vector<at::Tensor> originals;
  int64_t floats = 0;

  Replica(CollectiveGroup& group, double bucket_mb, bool overlap, at::Generator& generator) {
    ModelSection section;
    section.name = "cnn";
    model = ModelRegistry::with_builtins().build(section);
    for (const auto& [name, tensor] : model->parameters()) {
      params.emplace_back(name, tensor);
      originals.push_back(at::normal(0.0, 1.0, tensor.sizes(), generator));
      floats += tensor.numel();
    }
    ReducerOptions options;
    options.bucket_bytes = int64_t(bucket_mb * (1 << 20));
    // With overlap, as a training step that started no bucket during
    // backward: one all-reduce per bucket. Without, all as one.
    options.overlap = overlap;
    reducer = std::make_unique<GradientReducer>(params, group, options);
  }
  void prepare() {  // the same values every time
    for (size_t k = 0; k < params.size(); ++k) params[k].second.mutable_grad().copy_(originals[k]);
  }
  double reduce() {
    auto start = Clock::now();
    reducer->allreduce_mean(64);
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  }
};

int rank_main(int rank, int port, int repetitions) {
  at::set_num_threads(1);
  StorePtr store = open_tcp_store("127.0.0.1", port, false, 2, std::chrono::seconds(30));
  auto group = CollectiveGroup::gloo(prefixed("data/", store), rank, 2, std::chrono::seconds(60),
                                     {"127.0.0.1"});
  auto generator = at::make_generator<at::CPUGeneratorImpl>(rank + 1);
  Replica small(*group, 1.0, true, generator), large(*group, 25.0, true, generator),
      one(*group, 1.0, false, generator);
  std::vector<at::Tensor> flat{torch::zeros({small.floats + 1})};
  std::vector<at::Tensor> tiny{torch::ones({16})}, marker{torch::ones({16})};
  std::map<std::string, std::vector<double>> ms, ratio;
  auto since = [](Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  for (int i = 0; i < repetitions + 10; ++i) {  // the first 10: warm-up
    flat[0].normal_(0.0, 1.0, generator);
    small.prepare(), large.prepare(), one.prepare();
    // Its own small tensor: a flat all-reduce right after one of the same
    // tensor runs measurably faster here, which would flatter the reference.
    auto line_up = [&] { group->allreduce_sum(marker).wait(); };
    line_up();
    // The four timings in an order that rotates every repetition: here the
    // first collective after the set-up runs measurably faster than later
    // ones, so a fixed order would favour whichever goes first.
    std::map<std::string, double> took;
    const std::vector<std::string> names = {"flat", "bucket_mb_1", "bucket_mb_25", "overlap_off"};
    for (size_t k = 0; k < names.size(); ++k) {
      const std::string& name = names[(k + size_t(i)) % names.size()];
      line_up();
      if (name == "flat") {
        auto start = Clock::now();
        group->allreduce_sum(flat).wait();
        took[name] = since(start);
      } else {
        took[name] = (name == "bucket_mb_1" ? small : name == "bucket_mb_25" ? large : one).reduce();
      }
    }
    line_up();
    auto start = Clock::now();
    group->allreduce_sum(tiny).wait();
    const double t1 = since(start);
    line_up();
    start = Clock::now();
    group->allreduce_sum(tiny).wait();
    group->allreduce_sum(tiny).wait();
    const double t2 = since(start);
    if (i < 10) continue;
    for (const auto& [name, value] : took) {
      ms[name].push_back(value);
      if (name != "flat") ratio[name].push_back(took["flat"] / value);
    }
    ms["tiny_one"].push_back(t1), ms["tiny_two"].push_back(t2);
  }
  if (rank != 0) return 0;
  nlohmann::json medians, efficiency;
  for (auto& [key, values] : ms) medians[key] = median(values);
  for (auto& [key, values] : ratio) {
    efficiency[key] = spread(values);
    // Robust against this machine's bimodal wake-up latency, which makes
    // single repetitions' ratios scatter from 0.2 to 3.
    efficiency[key]["flat_median_over_median"] = medians["flat"].get<double>() / median(ms[key]);
  }
  nlohmann::json out = {
      {"benchmark", "sync_efficiency"},
      {"setup", {{"model", "cnn"}, {"gradient_floats", small.floats},
                 {"buckets", {{"bucket_mb_1", small.reducer->bucket_count()},
                              {"bucket_mb_25", large.reducer->bucket_count()},
                              {"overlap_off", one.reducer->bucket_count()}}},
                 {"all_reduces_per_call", {{"bucket_mb_1", small.reducer->collectives_last_step()},
                                           {"bucket_mb_25", large.reducer->collectives_last_step()},
                                           {"overlap_off", one.reducer->collectives_last_step()}}},
                 {"ranks", 2}, {"transport", "Gloo over loopback, one process per rank"},
                 {"threads_per_rank", 1}, {"repetitions", repetitions},
                 {"order", "interleaved per repetition in a rotating order, ranks lined up "
                           "(a separate 64-byte all-reduce) before each timing"}}},
      {"ms_median", medians},
      {"efficiency_flat_over_bucketed", efficiency}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--rank")
    return rank_main(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));
  const int repetitions = argc > 1 ? std::max(10, std::atoi(argv[1])) : 200;
  StorePtr server = open_tcp_store("127.0.0.1", 0, true, 2, std::chrono::seconds(60));
  const std::string port = std::to_string(store_port(server));
  const std::string count = std::to_string(repetitions);
  std::vector<pid_t> children;
  for (const char* rank : {"0", "1"}) {
    std::vector<std::string> args = {"/proc/self/exe", "--rank", rank, port, count};
    std::vector<char*> argv_child;
    for (auto& a : args) argv_child.push_back(a.data());
    argv_child.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv_child.data(), environ) != 0) {
      std::perror("sync_efficiency: starting a rank");
      for (pid_t child : children) kill(child, SIGKILL);
      return 1;
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  if (failed) std::fprintf(stderr, "sync_efficiency: %d rank(s) failed\n", failed);
  return failed ? 1 : 0;
}

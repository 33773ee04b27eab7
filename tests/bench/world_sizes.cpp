// Benchmark: does a job's result depend on the world size? For the
// built-in mlp and cnn on Fashion-MNIST, fp32 and bf16, the parameters of
// 2- and 4-rank runs against the one-rank run (same global batch) after
// every step: with comm.summation = exact (the default: microbatches of a
// fixed size, dropout drawn per microbatch, one thread per rank) and with
// float (today's DDP-like path: one microbatch per rank, no dropout).
// Prints "identical" or the distance per case to stderr, JSON to stdout.
// Usage: world_sizes [steps] [global batch]
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <nlohmann/json.hpp>

#include "support/cli_runner.h"
#include "support/world_size_drift.h"

int main(int argc, char** argv) {
  using namespace lockstep::testing;
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 50;
  const int64_t global_batch = argc > 2 ? std::atoll(argv[2]) : 64;
  TempDir dir;
  nlohmann::json runs = nlohmann::json::array();
  for (const std::string summation : {"exact", "float"})
    for (const std::string model : {"mlp", "cnn"})
      for (const std::string precision : {"fp32", "bf16"})
        for (const auto& drift : measure_world_sizes(model, {2, 4}, steps, global_batch, dir.path(), 3.0,
                                                     DriftSetup{summation, precision})) {
          nlohmann::json entry = drift.to_json();
          double largest = 0;
          for (double d : drift.distance) largest = std::max(largest, d);
          entry["summation"] = summation;
          entry["precision"] = precision;
          entry["distance_at_end"] = drift.distance.back();
          entry["verdict"] = largest == 0 ? "identical" : "differs";
          if (largest == 0)
            std::fprintf(stderr, "%-5s %-3s %-4s %d ranks: identical at every step\n", summation.c_str(),
                         model.c_str(), precision.c_str(), drift.world_size);
          else
            std::fprintf(stderr, "%-5s %-3s %-4s %d ranks: distance %.3g at the end\n", summation.c_str(),
                         model.c_str(), precision.c_str(), drift.world_size, drift.distance.back());
          runs.push_back(entry);
        }
  nlohmann::json out = {
      {"benchmark", "world_sizes"},
      {"setup", {{"job", "examples/fashion_mnist_cnn.toml, eval at the end only"},
                 {"exact", "comm.summation = exact, data.global_batch = G, data.microbatch = G / 4, "
                           "job.threads_per_rank = 1, model.dropout = 0.3"},
                 {"float", "comm.summation = float, data.batch_size = G / W, model.dropout = 0"},
                 {"steps", steps}, {"global_batch", global_batch}, {"world_sizes", {1, 2, 4}},
                 {"distance", "|theta_W - theta_1| / |theta_1| over all parameters, after each step"},
                 {"jump", "a step where the distance grew more than 3x"},
                 {"cores", std::thread::hardware_concurrency()}}},
      {"runs", runs}};
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}

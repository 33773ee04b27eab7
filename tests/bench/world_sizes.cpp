// Benchmark: the parameter distance of 2- and 4-rank runs to the one-rank
// run (same global batch, no dropout) after every step, for the built-in
// mlp and cnn on Fashion-MNIST, and what differed where the distance jumped.
// Prints JSON. Usage: world_sizes [steps] [global batch]
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
  for (const std::string model : {"mlp", "cnn"})
    for (const auto& drift : measure_world_sizes(model, {2, 4}, steps, global_batch, dir.path())) {
      nlohmann::json entry = drift.to_json();
      entry["distance_at_end"] = drift.distance.back();
      runs.push_back(entry);
    }
  nlohmann::json out = {
      {"benchmark", "world_sizes"},
      {"setup", {{"job", "examples/fashion_mnist_cnn.toml, model.dropout = 0, precision = fp32, eval at the end only"},
                 {"steps", steps}, {"global_batch", global_batch}, {"world_sizes", {1, 2, 4}},
                 {"distance", "|theta_W - theta_1| / |theta_1| over all parameters, after each step"},
                 {"jump", "a step where the distance grew more than 3x"},
                 {"cores", std::thread::hardware_concurrency()}}},
      {"runs", runs}};
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}

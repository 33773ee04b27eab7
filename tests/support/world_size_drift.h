#pragma once
// How far runs of one job at different world sizes (the same global batch)
// drift apart, step by step, and why: the parameters after every step come
// from each run's checkpoints (checkpoint.every = 1); at a step where the
// distance jumps, the step's global batch is sent through the built-in
// model (mlp or cnn) with both runs' parameters from before the step, and
// every ReLU whose sign and every max-pool window whose winner differ
// between the two is reported.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace lockstep::testing {

using Parameters = std::map<std::string, at::Tensor>;

// Parameters after steps 1, 2, ... from `run_folder`/checkpoints (model.pt).
std::vector<Parameters> parameters_by_step(const std::string& run_folder, const std::vector<std::string>& names);

// |a - b| / |b| over all tensors together.
double relative_distance(const Parameters& a, const Parameters& b);

// The built-in model's parameter names: mlp or cnn.
std::vector<std::string> builtin_parameter_names(const std::string& model);

struct ForwardDifference {
  int64_t relu_flips = 0;        // pre-activations on opposite sides of 0
  int64_t pool_changes = 0;      // max-pool windows won by another input
  nlohmann::json details;        // per layer: count, the first place and how close it was
  std::string summary;           // one line for people
};

// The forward of training step `step` (1-based) of a one-rank run with
// batch `global_batch` on Fashion-MNIST (data.path, job.seed `seed`, epoch 0)
// through `model` with parameters `a` and `b`.
ForwardDifference forward_difference(const std::string& model, const std::string& fashion_mnist, uint64_t seed,
                                     int64_t step, int64_t global_batch, const Parameters& a, const Parameters& b);

struct Jump {
  int64_t step = 0;       // 1-based
  double growth = 0;      // distance after the step over distance before it
  ForwardDifference forward;
};

struct WorldSizeDrift {
  std::string model;
  int world_size = 0;
  std::vector<double> distance;  // to the one-rank run, after steps 1, 2, ...
  std::vector<Jump> jumps;       // steps where the distance grew more than `jump_growth` times
  nlohmann::json to_json() const;
};

// How the runs sum and compute. float: comm.summation = float, each rank
// one microbatch of global_batch / W (today's DDP-like path), no dropout;
// exact: comm.summation = exact, microbatches of global_batch / 4 whatever
// W, one thread per rank, dropout 0.3 (drawn per microbatch).
struct DriftSetup {
  std::string summation = "float";
  std::string precision = "fp32";  // auto would pick bf16 on a CPU with native bf16
};

// Trains examples/fashion_mnist_cnn.toml with `model` (mlp or cnn) for
// `steps` steps with a global batch of `global_batch`, once on one rank and
// once on each of `world_sizes` (real lockstep processes, checkpoints every
// step in `dir`), and compares each with the one-rank run. A failed run
// throws, with its output.
std::vector<WorldSizeDrift> measure_world_sizes(const std::string& model, const std::vector<int>& world_sizes,
                                                int64_t steps, int64_t global_batch, const std::string& dir,
                                                double jump_growth = 3.0, const DriftSetup& setup = {});

}  // namespace lockstep::testing

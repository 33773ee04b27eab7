#include "support/world_size_drift.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>
#include <torch/torch.h>

#include "runtime/data/dataset.h"
#include "runtime/data/sampler.h"
#include "support/cli_runner.h"

namespace lockstep::testing {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read");
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// One layer's decisions in both runs: where they differ, and how close
// run a's values were to deciding the other way.
struct Layer {
  std::string name;
  at::Tensor pre_a, pre_b;       // ReLU inputs (pre-activations)
  at::Tensor pool_a, pool_b;     // max-pool winners' indices (undefined: no pool)
  at::Tensor pooled_input_a;     // what the pool chose from, in run a
};

std::string place(const at::Tensor& where, const at::Tensor& rows) {
  std::string text = "sample " + std::to_string(where[0].item<int64_t>()) + " (training row " +
                     std::to_string(rows[where[0].item<int64_t>()].item<int64_t>()) + ")";
  if (where.numel() == 2) return text + ", unit " + std::to_string(where[1].item<int64_t>());
  return text + fmt::format(", channel {}, at ({}, {})", where[1].item<int64_t>(), where[2].item<int64_t>(),
                            where[3].item<int64_t>());
}

void compare(const Layer& layer, const at::Tensor& rows, ForwardDifference& out) {
  const at::Tensor flips = (layer.pre_a > 0) != (layer.pre_b > 0);
  const int64_t relu = flips.sum().item<int64_t>();
  nlohmann::json entry = {{"layer", layer.name}, {"relu_flips", relu}};
  std::string line;
  if (relu > 0) {
    const at::Tensor where = flips.nonzero()[0];
    const double closest = at::minimum(layer.pre_a.abs(), layer.pre_b.abs()).masked_select(flips).max().item<double>();
    entry["relu_first"] = place(where, rows);
    entry["relu_largest_pre_activation"] = closest;
    line += fmt::format("{}: {} ReLU input(s) on opposite sides of 0 (first at {}; all within {:.1e} of 0)",
                        layer.name, relu, place(where, rows), closest);
  }
  if (layer.pool_a.defined()) {
    const at::Tensor changed = layer.pool_a != layer.pool_b;
    const int64_t pools = changed.sum().item<int64_t>();
    entry["pool_changes"] = pools;
    if (pools > 0) {
      const at::Tensor where = changed.nonzero()[0];
      const int64_t n = where[0].item<int64_t>(), c = where[1].item<int64_t>();
      const int64_t i = where[2].item<int64_t>(), j = where[3].item<int64_t>();
      // Indices point into the pooled plane, flattened: the two winners' values in run a.
      const at::Tensor plane = layer.pooled_input_a[n][c].flatten();
      const double won_a = plane[layer.pool_a[n][c][i][j].item<int64_t>()].item<double>();
      const double won_b = plane[layer.pool_b[n][c][i][j].item<int64_t>()].item<double>();
      entry["pool_first"] = place(where, rows);
      entry["pool_gap"] = std::abs(won_a - won_b);
      line += fmt::format("{}{}: {} max-pool window(s) won by another input (first at {}: {:.7g} against "
                          "{:.7g}, {:.1e} apart)",
                          line.empty() ? "" : "; ", layer.name + " pool", pools, place(where, rows), won_a, won_b,
                          std::abs(won_a - won_b));
    }
    out.pool_changes += pools;
  }
  out.relu_flips += relu;
  out.details.push_back(entry);
  if (!line.empty()) out.summary += (out.summary.empty() ? "" : "; ") + line;
}

std::vector<Layer> layers(const std::string& model, const at::Tensor& x, const Parameters& a, const Parameters& b) {
  std::vector<Layer> out;
  auto both = [&](auto&& f) { return std::make_pair(f(a), f(b)); };
  if (model == "mlp") {
    auto [h1a, h1b] = both([&](const Parameters& p) { return torch::linear(x.flatten(1), p.at("fc1.weight"), p.at("fc1.bias")); });
    out.push_back({"fc1", h1a, h1b, {}, {}, {}});
    auto [h2a, h2b] = std::make_pair(torch::linear(torch::relu(h1a), a.at("fc2.weight"), a.at("fc2.bias")),
                                     torch::linear(torch::relu(h1b), b.at("fc2.weight"), b.at("fc2.bias")));
    out.push_back({"fc2", h2a, h2b, {}, {}, {}});
    return out;
  }
  // cnn: conv-ReLU-pool twice, then fc-ReLU (dropout is off in these runs).
  at::Tensor in_a = x, in_b = x;
  for (const std::string conv : {"conv1", "conv2"}) {
    const at::Tensor pre_a = torch::conv2d(in_a, a.at(conv + ".weight"), a.at(conv + ".bias"), 1, 1);
    const at::Tensor pre_b = torch::conv2d(in_b, b.at(conv + ".weight"), b.at(conv + ".bias"), 1, 1);
    auto [pooled_a, index_a] = torch::max_pool2d_with_indices(torch::relu(pre_a), 2);
    auto [pooled_b, index_b] = torch::max_pool2d_with_indices(torch::relu(pre_b), 2);
    out.push_back({conv, pre_a, pre_b, index_a, index_b, torch::relu(pre_a)});
    in_a = pooled_a;
    in_b = pooled_b;
  }
  out.push_back({"fc", torch::linear(in_a.flatten(1), a.at("fc.weight"), a.at("fc.bias")),
                 torch::linear(in_b.flatten(1), b.at("fc.weight"), b.at("fc.bias")), {}, {}, {}});
  return out;
}

}  // namespace

std::vector<std::string> builtin_parameter_names(const std::string& model) {
  const std::vector<std::string> layers =
      model == "mlp" ? std::vector<std::string>{"fc1", "fc2", "head"} : std::vector<std::string>{"conv1", "conv2", "fc", "head"};
  std::vector<std::string> names;
  for (const auto& layer : layers) {
    names.push_back(layer + ".weight");
    names.push_back(layer + ".bias");
  }
  return names;
}

std::vector<Parameters> parameters_by_step(const std::string& run_folder, const std::vector<std::string>& names) {
  std::vector<std::string> steps;
  for (const auto& entry : fs::directory_iterator(run_folder + "/checkpoints"))
    if (entry.path().filename().string().rfind("step-", 0) == 0) steps.push_back(entry.path().string());
  std::sort(steps.begin(), steps.end());
  std::vector<Parameters> out;
  for (const auto& step : steps) {
    const std::string bytes = read_bytes(step + "/model.pt");
    torch::serialize::InputArchive archive;
    archive.load_from(bytes.data(), bytes.size());
    Parameters parameters;
    for (const auto& name : names) {
      at::Tensor tensor;
      if (!archive.try_read(name, tensor)) throw std::runtime_error(step + "/model.pt has no " + name);
      parameters[name] = tensor.detach().clone();
    }
    out.push_back(std::move(parameters));
  }
  return out;
}

double relative_distance(const Parameters& a, const Parameters& b) {
  double difference = 0, size = 0;
  for (const auto& [name, tensor] : b) {
    difference += (a.at(name).to(torch::kDouble) - tensor.to(torch::kDouble)).pow(2).sum().item<double>();
    size += tensor.to(torch::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(difference / size);
}

ForwardDifference forward_difference(const std::string& model, const std::string& fashion_mnist, uint64_t seed,
                                     int64_t step, int64_t global_batch, const Parameters& a, const Parameters& b) {
  static std::map<std::string, TrainTestData> loaded;
  if (!loaded.count(fashion_mnist)) loaded[fashion_mnist] = load_fashion_mnist(fashion_mnist);
  const Dataset& train = loaded[fashion_mnist].train;
  // One rank with the global batch: its batch `step` is the global batch of every world size.
  const std::vector<int64_t> order = DistributedSampler(train.size(), 0, 1, seed).indices(0);
  if (step * global_batch > int64_t(order.size())) throw std::runtime_error("step past the first epoch");
  const at::Tensor rows =
      torch::tensor(std::vector<int64_t>(order.begin() + (step - 1) * global_batch, order.begin() + step * global_batch),
                    torch::kLong);
  torch::NoGradGuard no_grad;
  ForwardDifference out;
  out.details = nlohmann::json::array();
  for (const Layer& layer : layers(model, train.input_rows(rows), a, b)) compare(layer, rows, out);
  if (out.summary.empty()) out.summary = "no ReLU input changed sign and no max-pool window changed its winner";
  return out;
}

nlohmann::json WorldSizeDrift::to_json() const {
  nlohmann::json jumps_json = nlohmann::json::array();
  for (const auto& jump : jumps)
    jumps_json.push_back({{"step", jump.step}, {"growth", jump.growth}, {"relu_flips", jump.forward.relu_flips},
                          {"pool_changes", jump.forward.pool_changes}, {"what_differs", jump.forward.summary},
                          {"layers", jump.forward.details}});
  return {{"model", model}, {"world_size", world_size}, {"distance_by_step", distance}, {"jumps", jumps_json}};
}

std::vector<WorldSizeDrift> measure_world_sizes(const std::string& model, const std::vector<int>& world_sizes,
                                                int64_t steps, int64_t global_batch, const std::string& dir,
                                                double jump_growth, const DriftSetup& setup) {
  const std::string job = examples_dir() + "/fashion_mnist_cnn.toml";
  const std::vector<std::string> names = builtin_parameter_names(model);
  auto train = [&](int world) {
    const std::string runs = dir + "/" + model + "-" + setup.summation + "-" + setup.precision + "-" +
                             std::to_string(world);
    std::vector<std::string> args = {"run", job, "--nproc", std::to_string(world)};
    std::vector<std::string> sets = {"model.name=" + model, "precision=" + setup.precision, "job.epochs=0",
                                     "job.steps=" + std::to_string(steps), "checkpoint.every=1",
                                     "checkpoint.keep=1000", "eval.every=0", "job.run_dir=" + runs,
                                     "comm.summation=" + setup.summation};
    if (setup.summation == "exact")
      sets.insert(sets.end(), {"model.dropout=0.3", "data.global_batch=" + std::to_string(global_batch),
                               "data.microbatch=" + std::to_string(global_batch / 4), "job.threads_per_rank=1"});
    else
      sets.insert(sets.end(), {"model.dropout=0", "data.batch_size=" + std::to_string(global_batch / world)});
    for (const std::string& set : sets) {
      args.push_back("--set");
      args.push_back(set);
    }
    const CommandResult result = run_lockstep(args, dir, 600);
    if (result.exit_code != 0)
      throw std::runtime_error(model + " on " + std::to_string(world) + " ranks failed:\n" + result.output);
    return parameters_by_step(single_run(runs), names);
  };
  const std::vector<Parameters> one = train(1);
  const uint64_t seed = 42;  // job.seed of examples/fashion_mnist_cnn.toml
  std::vector<WorldSizeDrift> out;
  for (int world : world_sizes) {
    const std::vector<Parameters> many = train(world);
    WorldSizeDrift drift{model, world, {}, {}};
    for (size_t s = 0; s < one.size() && s < many.size(); ++s) drift.distance.push_back(relative_distance(many[s], one[s]));
    for (size_t s = 1; s < drift.distance.size(); ++s) {
      const double before = drift.distance[s - 1], after = drift.distance[s];
      if (before > 0 && after / before > jump_growth)
        drift.jumps.push_back({int64_t(s) + 1, after / before,
                               forward_difference(model, "/usr/share/datasets/fashion-mnist", seed, int64_t(s) + 1,
                                                  global_batch, one[s - 1], many[s - 1])});
    }
    out.push_back(std::move(drift));
  }
  return out;
}

}  // namespace lockstep::testing

#include "runtime/train/evaluate.h"

#include <cmath>
#include <optional>

#include <spdlog/fmt/fmt.h>
#include <torch/torch.h>

#include "runtime/comm/exact_sum.h"
#include "runtime/comm/process_group.h"
#include "runtime/base/errors.h"
#include "runtime/loss/objective.h"
#include "runtime/model/model.h"

namespace lockstep {

EvalResult evaluate(Model& model, const Objective& objective, const Dataset& test, int rank,
                    int world_size, int64_t batch_size, CollectiveGroup& group,
                    const std::string& precision, const std::string& where) {
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.train(false);
  // The test set in chunks of batch_size in order, rank r of W taking a
  // contiguous block of them; each chunk's sums are one item of an exact
  // sum, so the figures do not depend on the world size.
  const int64_t chunks = (test.size() + batch_size - 1) / batch_size;
  const int64_t first = chunks * rank / world_size, end = chunks * (rank + 1) / world_size;
  std::vector<std::vector<double>> rows;
  for (int64_t chunk = first; chunk < end; ++chunk) {
    const int64_t start = chunk * batch_size;
    at::Tensor indices = torch::arange(start, std::min(start + batch_size, test.size()), torch::kInt64);
    std::vector<int64_t> unreadable;
    const at::Tensor inputs = test.input_rows(indices, &unreadable).to(model.device());
    const at::Tensor targets = test.target_rows(indices, unreadable).to(model.device());
    run_model_call(where, precision, model, [&] {
      rows.push_back(objective.metric_sums(forward_output(model, inputs, autocast_dtype(precision)), targets));
    });
  }
  // A rank with no chunk (more ranks than chunks) still takes part: the
  // number of sums is learned from a forward of one sample.
  int64_t columns = rows.empty() ? 0 : int64_t(rows.front().size());
  if (rows.empty())
    run_model_call(where, precision, model, [&] {
      at::Tensor output = forward_output(model, test.input_rows(torch::zeros({1}, torch::kLong)).to(model.device()),
                                         autocast_dtype(precision));
      columns = int64_t(objective.metric_sums(output, test.targets.narrow(0, 0, 1).to(model.device())).size());
    });
  model.train(was_training);
  at::Tensor table = torch::zeros({int64_t(rows.size()), columns}, torch::kDouble);
  auto cells = table.accessor<double, 2>();
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t c = 0; c < columns; ++c) cells[int64_t(r)][c] = rows[r][size_t(c)];
  // On the model's device: NCCL reduces CUDA tensors only.
  const std::vector<double> sums = exact_column_sums(group, table, columns, chunks, model.device());
  EvalResult result;
  result.samples = test.size();
  result.metrics = objective.metrics(sums);
  result.loss = result.metrics.value("loss", 0.0);
  result.accuracy = result.metrics.value("accuracy", 0.0);
  return result;
}

std::string change_within_noise(const std::string& metric, int64_t before_step, const EvalResult& before,
                                int64_t step, const EvalResult& now) {
  auto number = [](const nlohmann::json& metrics, const std::string& key) -> std::optional<double> {
    auto it = metrics.find(key);
    if (it == metrics.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  };
  const auto was = number(before.metrics, metric), is = number(now.metrics, metric);
  const auto low = number(now.metrics, metric + "_ci95_low"), high = number(now.metrics, metric + "_ci95_high");
  if (!was || !is || !low || !high) return "";
  const double change = *is - *was, half = (*high - *low) / 2;
  if (std::abs(change) >= half) return "";
  return fmt::format("{} moved by {:+.4f} from step {} to step {}, less than the half-width of its 95% interval "
                     "(+/-{:.4f} with n = {}): that change cannot be told from sampling noise; evaluate on more "
                     "samples before judging it (a best checkpoint, an early stop, a comparison of runs)",
                     metric, change, before_step, step, half, now.metrics.value("targets", int64_t(0)));
}

std::string describe_metrics(const Objective& objective, const EvalResult& eval) {
  // A figure with its 95% interval where one was computed: "accuracy 0.9170 [0.9115, 0.9222]".
  auto with_interval = [&](const std::string& key, double value) {
    const auto low = eval.metrics.find(key + "_ci95_low"), high = eval.metrics.find(key + "_ci95_high");
    if (low == eval.metrics.end() || high == eval.metrics.end() || !low->is_number() || !high->is_number())
      return fmt::format("{:.4f}", value);
    return fmt::format("{:.4f} [{:.4f}, {:.4f}]", value, low->get<double>(), high->get<double>());
  };
  auto is_bound = [](const std::string& key) {
    return key.size() > 10 && (key.compare(key.size() - 10, 10, "_ci95_high") == 0 ||
                               key.compare(key.size() - 9, 9, "_ci95_low") == 0);
  };
  std::string text = fmt::format("test loss {} ({})", with_interval("loss", eval.loss), objective.name());
  for (const auto& [key, value] : eval.metrics.items()) {
    if (key == "loss" || key == "targets" || is_bound(key)) continue;
    if (value.is_number()) {
      text += fmt::format(", {} {}", key, with_interval(key, value.get<double>()));
    } else if (value.is_array()) {
      std::string items;
      for (const auto& item : value)
        items += (items.empty() ? "" : " ") + (item.is_number() ? fmt::format("{:.3f}", item.get<double>()) : item.dump());
      text += ", " + key + " [" + items + "]";
    }
  }
  if (auto n = eval.metrics.find("targets"); n != eval.metrics.end() && n->is_number_integer())
    text += fmt::format(" (n = {}, 95% intervals)", n->get<int64_t>());
  return text;
}

}  // namespace lockstep

#include "runtime/audit/cross_check.h"

#include <cstring>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/torch.h>

namespace lockstep {
namespace {

constexpr size_t kTensorsDescribed = 8;  // per mismatch: the first that differ

int64_t double_bits(double value) {
  int64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

double double_from_bits(int64_t bits) {
  double value = 0;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// How `recomputed` differs from `owner`'s: elements, the largest |difference| and where.
std::string difference(const std::string& name, const at::Tensor& owner, const at::Tensor& recomputed) {
  const at::Tensor a = owner.reshape({-1}).to(at::kDouble), b = recomputed.reshape({-1}).to(at::kDouble);
  const at::Tensor diff = (a - b).abs();
  const at::Tensor differs = a.ne(b).logical_and(a.isnan().logical_and(b.isnan()).logical_not());
  const int64_t count = differs.sum().item<int64_t>();
  if (count == 0) return name + ": the same values, different bits (a sign of zero)";
  const at::Tensor finite = torch::where(diff.isnan(), torch::full_like(diff, INFINITY), diff);
  const int64_t at = finite.argmax().item<int64_t>();
  return fmt::format("{}: {} of {} elements differ, max |diff| {:.3g} at element {} (owner {:.9g}, recomputed {:.9g})",
                     name, count, a.numel(), finite[at].item<double>(), at, a[at].item<double>(), b[at].item<double>());
}

}  // namespace

std::string Miscompute::describe() const {
  std::string text = fmt::format(
      "MISCOMPUTE at step {}, microbatch {}: rank {} ({}) computed it, rank {} ({}) computed it again and got "
      "other bits",
      step, microbatch, owner, owner_host, checker, checker_host);
  if (loss_differs)
    text += fmt::format("; the loss sum differs (owner {:.9g}, recomputed {:.9g})", owner_loss, checker_loss);
  if (!tensors.empty()) {
    text += "; gradients that differ: ";
    for (size_t i = 0; i < tensors.size(); ++i) text += (i ? "; " : "") + tensors[i];
  }
  return text;
}

CrossChecker::CrossChecker(ControlGroup& control, int rank, int world_size, int64_t per_rank, int64_t every,
                           std::vector<std::string> hosts, std::vector<std::string> tensor_names)
    : control_(control), rank_(rank), world_(world_size),
      rotation_{std::max(2, world_size), std::max<int64_t>(1, per_rank)}, every_(world_size >= 2 ? every : 0), hosts_(std::move(hosts)), names_(std::move(tensor_names)) {}

bool CrossChecker::due(int64_t step) const {
  if (world_ < 2) return false;
  return (every_ > 0 && step % every_ == 0) || asked_.count(step) > 0;
}

int64_t CrossChecker::check_number(int64_t step) const {
  return every_ > 0 && step % every_ == 0 ? step / every_ : step;
}


int64_t CrossChecker::to_recompute(int64_t step) const {
  const int64_t c = check_number(step);
  return rotation_.microbatch_of(rotation_.owner_checked_by(rank_, c), c);
}

int64_t CrossChecker::own_checked(int64_t step) const {
  return rotation_.microbatch_of(rank_, check_number(step));
}

std::vector<Miscompute> CrossChecker::compare(const MicrobatchDigest& own, const std::vector<at::Tensor>& own_gradients,
                                              const MicrobatchDigest& recomputed,
                                              const std::vector<at::Tensor>& recomputed_gradients) {
  const size_t n = names_.size();
  if (own.tensors.size() != n || recomputed.tensors.size() != n)
    throw std::logic_error("cross-check: digests of " + std::to_string(own.tensors.size()) + " and " +
                           std::to_string(recomputed.tensors.size()) + " tensors for a model of " + std::to_string(n));
  std::vector<int64_t> mine = {own.index, recomputed.index, double_bits(own.loss_sum), double_bits(own.valid),
                               double_bits(recomputed.loss_sum), double_bits(recomputed.valid)};
  for (const auto& d : own.tensors) mine.push_back(int64_t(d.high)), mine.push_back(int64_t(d.low));
  for (const auto& d : recomputed.tensors) mine.push_back(int64_t(d.high)), mine.push_back(int64_t(d.low));
  // Gloo's all-gather on the control group, not the store: a check every
  // few steps must not make the coordinator part of the step.
  const std::vector<at::Tensor> gathered =
      control_.collectives().allgather(torch::tensor(mine, torch::kLong));
  std::vector<std::vector<int64_t>> all;
  for (const auto& t : gathered) {
    const at::Tensor flat = t.to(at::kCPU).contiguous();
    all.emplace_back(flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel());
  }

  const int64_t step = own.step;
  std::vector<Miscompute> found;
  std::vector<std::vector<size_t>> differing;  // per mismatch: tensor indices
  for (int checker = 0; checker < world_; ++checker) {
    const int owner = rotation_.owner_checked_by(checker, check_number(step));
    const auto& c = all[size_t(checker)];
    const auto& o = all[size_t(owner)];
    if (c[1] != o[0])
      throw RunError(fmt::format("cross-check at step {}: rank {} recomputed microbatch {}, but rank {} offers {} "
                                 "(the ranks disagree on the rotation: a version mismatch?)",
                                 step, checker, c[1], owner, o[0]));
    Miscompute m;
    m.step = step;
    m.microbatch = o[0];
    m.owner = owner;
    m.checker = checker;
    m.owner_host = hosts_.at(size_t(owner));
    m.checker_host = hosts_.at(size_t(checker));
    m.loss_differs = o[2] != c[4] || o[3] != c[5];
    m.owner_loss = double_from_bits(o[2]);
    m.checker_loss = double_from_bits(c[4]);
    std::vector<size_t> tensors;
    for (size_t t = 0; t < n; ++t)
      if (o[6 + 2 * t] != c[6 + 2 * n + 2 * t] || o[7 + 2 * t] != c[7 + 2 * n + 2 * t]) tensors.push_back(t);
    if (!m.loss_differs && tensors.empty()) continue;
    found.push_back(m);
    differing.push_back(tensors);
  }
  if (found.empty()) return found;

  // By how much: each owner sends its differing gradients to everyone (a
  // broadcast on the control group, the same sequence on every rank); its
  // checker compares them with its own recomputation and says what it saw.
  std::string said;
  for (size_t i = 0; i < found.size(); ++i) {
    const Miscompute& m = found[i];
    for (size_t k = 0; k < differing[i].size() && k < kTensorsDescribed; ++k) {
      const size_t t = differing[i][k];
      at::Tensor values = own_gradients.at(t).detach().to(at::kCPU).contiguous().clone();
      control_.collectives().broadcast(values, m.owner);
      if (rank_ == m.checker)
        said += difference(names_[t], values, recomputed_gradients.at(t).detach().to(at::kCPU)) + "\n";
    }
    if (rank_ == m.checker && differing[i].size() > kTensorsDescribed)
      said += fmt::format("and {} more tensors\n", differing[i].size() - kTensorsDescribed);
  }
  const auto told = control_.exchange("miscompute-detail", said);
  for (auto& m : found) {
    std::istringstream lines(told.at(size_t(m.checker)));
    for (std::string line; std::getline(lines, line);)
      if (!line.empty()) m.tensors.push_back(line);
  }
  return found;
}

}  // namespace lockstep

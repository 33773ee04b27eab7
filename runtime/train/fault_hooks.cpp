#include "runtime/train/fault_hooks.h"

#include <csignal>
#include <cstdlib>
#include <limits>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "runtime/base/errors.h"

namespace lockstep {

FaultHooks::FaultHooks(const JobConfig& config, int rank, NamedTensors parameters)
    : config_(config), rank_(rank), parameters_(std::move(parameters)),
      faults_(parse_injected_faults(config.fault.inject)) {
  // inf_grad: a gradient hook on this rank writes inf into element 0 before
  // the gradient reaches the reducer's bucket.
  for (const auto& f : faults_) {
    if (f.kind != "inf_grad" || f.rank != rank_) continue;
    parameter(f.tensor).register_hook([current = current_step_, quiet = quiet_, f](at::Tensor grad) {
      if (*current + 1 != f.step || *quiet) return grad;
      spdlog::warn("fault.inject: element 0 of the gradient of {} is inf on rank {} in step {}",
                   f.tensor, f.rank, f.step);
      at::Tensor planted = grad.clone();
      planted.view(-1)[0] = std::numeric_limits<float>::infinity();
      return planted;
    });
  }
  // bitflip_grad: a processor that computes one bit wrong. The hook runs
  // before the gradient reaches the reducer's bucket, on the first backward
  // of the step only: the first microbatch this rank computes in it.
  for (const auto& f : faults_) {
    if (f.kind != "bitflip_grad" || f.rank != rank_) continue;
    auto flipped_in = std::make_shared<int64_t>(-1);
    parameter(f.tensor).register_hook([current = current_step_, quiet = quiet_, flipped_in, f](at::Tensor grad) {
      if (*current + 1 != f.step || *flipped_in == f.step || *quiet) return grad;
      *flipped_in = f.step;
      at::Tensor planted = grad.clone();
      at::Tensor first = planted.view(-1).narrow(0, 0, 1);
      const auto bits = first.element_size() == 8   ? at::kLong
                        : first.element_size() == 4 ? at::kInt
                                                    : at::kShort;
      first.view(bits).bitwise_xor_(1);  // the lowest bit of the mantissa
      spdlog::warn("fault.inject: the lowest mantissa bit of element 0 of the gradient of {} flipped on rank {} "
                   "in step {} ({:.9g} -> {:.9g}), before any sum", f.tensor, f.rank, f.step,
                   grad.view(-1)[0].item<double>(), first.item<double>());
      return planted;
    });
  }
}

at::Tensor& FaultHooks::parameter(const std::string& name) {
  for (auto& [n, t] : parameters_)
    if (n == name) return t;
  throw InputError("fault.inject names tensor '" + name + "', which the model does not have");
}

void FaultHooks::on_loss(int64_t step, at::Tensor& loss_sum) const {
  if (config_.test.fail_rank != rank_ || config_.test.fail_step != step) return;
  // Only in the first test.fail_generations generations, so that a
  // restarted job can get past it.
  const char* generation = std::getenv("LOCKSTEP_RESTART_COUNT");
  if (generation && std::atoll(generation) >= config_.test.fail_generations) return;
  if (config_.test.fail_kind == "kill") {
    spdlog::error("test.fail_kind = kill: rank {} sends itself SIGKILL at step {}", rank_, step);
    std::fflush(nullptr);
    std::raise(SIGKILL);
  }
  if (config_.test.fail_kind == "exit") {
    spdlog::error("test.fail_kind = exit: rank {} exits with status 3 at step {}", rank_, step);
    std::fflush(nullptr);
    std::_Exit(3);
  }
  loss_sum = loss_sum * std::numeric_limits<float>::quiet_NaN();
}

// A per-tensor gradient scale by 0.5 on every rank, where on the faulty
// rank a second entry aliases the tensor's gradient (shared storage), so
// its values are scaled twice there.
void FaultHooks::before_update(int64_t step) {
  for (const auto& f : faults_) {
    if (f.kind != "double_scale" || f.step != step) continue;
    at::Tensor grad = parameter(f.tensor).mutable_grad();
    std::vector<at::Tensor> entries{grad};
    if (f.rank == rank_) entries.push_back(grad.view_as(grad));  // same storage
    for (auto& g : entries) g.mul_(0.5);
    if (f.rank == rank_)
      spdlog::warn("fault.inject: the gradient of {} shares storage with a second entry on rank {} "
                   "and was scaled twice at step {}", f.tensor, rank_, step);
  }
}

void FaultHooks::after_update(int64_t step) {
  for (const auto& f : faults_) {
    if (f.kind != "perturb" || f.rank != rank_ || f.step != step) continue;
    torch::NoGradGuard no_grad;
    parameter(f.tensor).view(-1)[0].add_(f.amount);
    spdlog::warn("fault.inject: added {:g} to element 0 of {} on rank {} after step {}", f.amount,
                 f.tensor, rank_, step);
  }
}

}  // namespace lockstep

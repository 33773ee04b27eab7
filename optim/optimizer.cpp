#include "optim/optimizer.h"

#include <cmath>
#include <stdexcept>

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace lockstep::optim {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor>& params,
                                                        const OptimizerSpec& spec) {
  if (spec.name == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(spec.lr)
                    .momentum(spec.momentum)
                    .weight_decay(spec.weight_decay));
  }
  if (spec.name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(spec.lr).weight_decay(spec.weight_decay));
  }
  throw std::invalid_argument("unknown optimizer '" + spec.name + "' (allowed: sgd, adamw)");
}

double scheduled_lr(const ScheduleSpec& spec, int64_t step) {
  if (spec.warmup_steps > 0 && step < spec.warmup_steps)
    return spec.base_lr * double(step + 1) / double(spec.warmup_steps);
  if (spec.kind == "cosine") {
    const double span = double(std::max<int64_t>(1, spec.total_steps - spec.warmup_steps));
    const double progress = std::min(1.0, double(step - spec.warmup_steps) / span);
    return 0.5 * spec.base_lr * (1.0 + std::cos(M_PI * progress));
  }
  return spec.base_lr;
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace lockstep::optim

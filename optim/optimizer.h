#pragma once
// Optimizers and learning-rate schedules. Depends on LibTorch only.
#include <memory>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>

namespace lockstep::optim {

struct OptimizerSpec {
  std::string name = "sgd";   // sgd | adamw
  double lr = 0.05;           // peak learning rate
  double momentum = 0.9;      // sgd only
  double weight_decay = 0.0;  // sgd: L2 added to the gradient; adamw: decoupled
};

// Builds the optimizer. Throws std::invalid_argument for an unknown name.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor>& params,
                                                        const OptimizerSpec& spec);

struct ScheduleSpec {
  double base_lr = 0.05;
  int64_t warmup_steps = 0;   // linear from base_lr / warmup_steps up to base_lr
  int64_t total_steps = 1;
  std::string kind = "constant";  // constant | cosine (to 0 at total_steps)
};

// Learning rate for the 0-based optimizer step `step`.
double scheduled_lr(const ScheduleSpec& spec, int64_t step);

// Sets the learning rate of every parameter group.
void set_lr(torch::optim::Optimizer& optimizer, double lr);

}  // namespace lockstep::optim

#pragma once
// Optimizers and learning-rate schedules. Depends on LibTorch only.
//
// An optimizer updates parameters held in flat segments (a contiguous
// buffer of parameters and the matching buffer of their gradients, laid out
// alike), so a step costs a handful of operations per segment instead of a
// few per parameter: what makes a deep model of small layers cheap to step.
// Its state (momentum, moments, step count) is flat too, and saves and loads
// bit for bit.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace lockstep::optim {

struct OptimizerSpec {
  std::string name = "sgd";   // sgd | adamw | adam | rmsprop
  double lr = 0.05;           // peak learning rate
  double momentum = 0.9;      // sgd, rmsprop
  double weight_decay = 0.0;  // adamw: decoupled; the others: L2 added to the gradient
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw (eps: rmsprop too)
  double alpha = 0.99;        // rmsprop: smoothing of the squared gradient
  bool nesterov = false;      // sgd
};

// Parameters and their gradients, both 1-D, contiguous, same length; the
// parameter tensor's elements are the model's (views of the same memory).
struct Segment {
  at::Tensor params;
  at::Tensor grads;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of every segment from its gradients at the current rate.
  virtual void step() = 0;
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  int64_t steps_taken() const { return steps_; }
  const std::string& name() const { return spec_.name; }

  // Every state tensor and the step count. load() refuses state from
  // another kind of optimizer or another layout, naming what differs.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  std::vector<uint8_t> save_to_bytes() const;
  // The state tensors (momentum; or the moments), per segment and slot:
  // what a digest of the optimizer's state reads.
  const std::vector<std::vector<at::Tensor>>& state() const { return state_; }
  void load_from_bytes(const std::vector<uint8_t>& bytes);

 protected:
  Optimizer(std::vector<Segment> segments, OptimizerSpec spec, int slots_per_segment);
  std::vector<Segment> segments_;
  OptimizerSpec spec_;
  double lr_;
  int64_t steps_ = 0;
  // state_[segment][slot]: flat like the segment (momentum; or the moments).
  std::vector<std::vector<at::Tensor>> state_;
};

// Builds the optimizer: each makes the update torch.optim's namesake makes
// (SGD with dampening 0, Adam/AdamW without amsgrad, RMSprop not centered).
// Throws std::invalid_argument for an unknown name or
// a segment whose parameters and gradients do not match.
std::unique_ptr<Optimizer> make_optimizer(std::vector<Segment> segments, const OptimizerSpec& spec);

struct ScheduleSpec {
  double base_lr = 0.05;
  int64_t warmup_steps = 0;   // linear from base_lr / warmup_steps up to base_lr
  int64_t total_steps = 1;
  std::string kind = "constant";  // constant | cosine (to 0 at total_steps)
};

// Learning rate for the 0-based optimizer step `step`.
double scheduled_lr(const ScheduleSpec& spec, int64_t step);

}  // namespace lockstep::optim

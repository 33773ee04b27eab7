#pragma once
// Test-only faults, kept out of the training loop: fault.inject (perturb a
// parameter after a step, double-scale a gradient through an alias, plant
// an inf in a gradient before the all-reduce, flip a gradient's bit) and test.fail_* (a rank that
// exits, is killed, or gets a NaN loss at a step). The trainer calls the
// hooks at fixed points; with nothing injected each call returns at once.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/job/config.h"
#include "runtime/model/model.h"

namespace lockstep {

class FaultHooks {
 public:
  // `parameters` are the model's trainable ones (fault.inject names them);
  // inf_grad faults for this rank are installed as gradient hooks now.
  FaultHooks(const JobConfig& config, int rank, NamedTensors parameters);

  // Before step `step` (0-based) starts: the step the gradient hooks see.
  void begin_step(int64_t step) { *current_step_ = step; }
  // While true, the gradient hooks let every gradient pass: a microbatch
  // computed again to check another rank's is computed as a healthy rank would.
  void set_quiet(bool quiet) { *quiet_ = quiet; }
  // test.fail_*: may exit or kill this process, or turn `loss_sum` into NaN.
  void on_loss(int64_t step, at::Tensor& loss_sum) const;
  // fault.inject double_scale, just before the optimizer step `step` (1-based).
  void before_update(int64_t step);
  // fault.inject perturb, just after the optimizer step `step` (1-based).
  void after_update(int64_t step);

 private:
  at::Tensor& parameter(const std::string& name);

  const JobConfig& config_;
  int rank_;
  NamedTensors parameters_;
  std::vector<InjectedFault> faults_;
  std::shared_ptr<int64_t> current_step_ = std::make_shared<int64_t>(0);
  std::shared_ptr<bool> quiet_ = std::make_shared<bool>(false);
};

}  // namespace lockstep

#pragma once
// What a run minimises and what its evaluation reports, for one loss.name:
// the loss as a sum over this batch's valid targets with their count (the
// trainer divides by the count over the global batch, so W ranks x B equals
// 1 x W*B), and the metrics that fit the loss (accuracy and top-5 for
// classes, MSE and MAE for regression, per-label accuracy for multi-label).
// Missing targets (class -1, float NaN) count in neither.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/job/config.h"
#include "runtime/loss/masked_loss.h"

namespace lockstep {

class Model;

class Objective {
 public:
  virtual ~Objective() = default;
  // The loss sum over the valid targets of one batch (differentiable).
  // Throws InputError when output and target do not fit, naming both shapes.
  virtual MaskedLoss loss(const at::Tensor& output, const at::Tensor& target) const = 0;
  // Evaluation: per-batch sums that add up over batches and ranks, then
  // the metrics from the totals (with "loss", the mean over valid targets).
  virtual std::vector<double> metric_sums(const at::Tensor& output, const at::Tensor& target) const = 0;
  virtual nlohmann::json metrics(const std::vector<double>& sums) const = 0;
  // The metric a person reads first ("accuracy", "mse", ...).
  virtual std::string headline() const = 0;
  // What one unit of the loss's count is: "sample" or "target value".
  virtual std::string unit() const = 0;
  const std::string& name() const { return name_; }

 protected:
  explicit Objective(std::string name) : name_(std::move(name)) {}

 private:
  std::string name_;
};

// The objective for loss.name; `model` for loss.name = model (its own loss).
std::unique_ptr<Objective> make_objective(const LossSection& loss, Model& model);

}  // namespace lockstep

#include "runtime/loss/objective.h"

#include <torch/torch.h>

#include "runtime/base/errors.h"
#include "runtime/loss/intervals.h"
#include "runtime/model/model.h"

namespace lockstep {
namespace {

std::string shape(const at::Tensor& t) { return c10::str(t.sizes()); }

double sum_of(const at::Tensor& t) { return t.sum(at::kDouble).item<double>(); }

double share(double part, double whole) { return whole > 0 ? part / whole : 0.0; }

// Sums every objective starts with: the loss over valid targets and their count.
enum : size_t { kLossSum = 0, kCount = 1, kFirstMetric = 2 };

nlohmann::json mean_loss(const std::vector<double>& sums) {
  return {{"loss", share(sums[kLossSum], sums[kCount])}, {"targets", int64_t(sums[kCount])}};
}

// `name`_ci95_low and _high: the interval goes wherever the figure goes
// (events, TensorBoard, the report, status) as plain numbers beside it.
void add_interval(nlohmann::json& out, const std::string& name, const Interval& interval) {
  out[name + "_ci95_low"] = interval.low;
  out[name + "_ci95_high"] = interval.high;
}

class CrossEntropy : public Objective {
 public:
  explicit CrossEntropy(double label_smoothing)
      : Objective("cross_entropy"), label_smoothing_(label_smoothing) {}

  MaskedLoss loss(const at::Tensor& output, const at::Tensor& target) const override {
    if (output.dim() != 2 || target.dim() != 1 || output.size(0) != target.size(0))
      throw InputError("loss.name = cross_entropy needs an output [batch, classes] and class "
                       "targets [batch]; the model gave " + shape(output) + " for targets " +
                       shape(target) + " (float targets of the output's shape: mse, l1 or "
                       "bce_with_logits)");
    return masked_cross_entropy_sum(output, target, label_smoothing_);
  }
  std::vector<double> metric_sums(const at::Tensor& output, const at::Tensor& target) const override {
    MaskedLoss l = loss(output, target);
    classes_ = output.size(1);
    at::Tensor valid = target.is_floating_point() ? ~target.isnan() : target.ge(0);
    at::Tensor labels = target.masked_fill(~valid, 0).to(at::kLong).unsqueeze(1);
    at::Tensor top = std::get<1>(output.topk(std::min<int64_t>(5, classes_), 1));
    at::Tensor hit1 = top.narrow(1, 0, 1).eq(labels).squeeze(1) & valid;
    at::Tensor hit5 = top.eq(labels).any(1) & valid;
    // Each sample's loss, for the spread of the mean: as the loss defines it.
    at::Tensor log_p = output.to(at::kDouble).log_softmax(1);
    at::Tensor per_sample = -(1 - label_smoothing_) * log_p.gather(1, labels).squeeze(1) -
                            label_smoothing_ * log_p.mean(1);
    return {l.sum.item<double>(), double(l.valid), sum_of(hit1), sum_of(hit5),
            sum_of(per_sample.pow(2).masked_fill(~valid, 0.0))};
  }
  nlohmann::json metrics(const std::vector<double>& sums) const override {
    nlohmann::json out = mean_loss(sums);
    add_interval(out, "loss", t_interval95(sums[kLossSum], sums[kFirstMetric + 2], sums[kCount]));
    out["accuracy"] = share(sums[kFirstMetric], sums[kCount]);
    add_interval(out, "accuracy", wilson95(sums[kFirstMetric], sums[kCount]));
    if (classes_ >= 10) {
      out["top5_accuracy"] = share(sums[kFirstMetric + 1], sums[kCount]);
      add_interval(out, "top5_accuracy", wilson95(sums[kFirstMetric + 1], sums[kCount]));
    }
    return out;
  }
  std::string headline() const override { return "accuracy"; }
  std::string unit() const override { return "sample"; }

 private:
  double label_smoothing_;
  mutable int64_t classes_ = 0;  // from the last batch evaluated
};

// mse, l1 and bce_with_logits: float targets of the output's shape.
class ElementWise : public Objective {
 public:
  ElementWise(std::string name, ElementLoss kind) : Objective(std::move(name)), kind_(kind) {}

  MaskedLoss loss(const at::Tensor& output, const at::Tensor& target) const override {
    return masked_elementwise_sum(output, fit(output, target), kind_);
  }
  std::vector<double> metric_sums(const at::Tensor& output, const at::Tensor& target) const override {
    at::Tensor t = fit(output, target);
    MaskedLoss l = masked_elementwise_sum(output, t, kind_);
    at::Tensor valid = ~t.isnan();
    at::Tensor filled = t.masked_fill(~valid, 0.0);
    std::vector<double> sums{l.sum.item<double>(), double(l.valid)};
    if (kind_ != ElementLoss::kBinaryCrossEntropyWithLogits) {
      at::Tensor error = (output - filled).masked_fill(~valid, 0.0).to(at::kDouble);
      sums.push_back(sum_of(error.pow(2)));
      sums.push_back(sum_of(error.abs()));
      sums.push_back(sum_of(error.pow(4)));  // squares of each value's squared error, for the mse's spread
      return sums;
    }
    // Per label: correct predictions (logit > 0 against target > 0.5) and targets.
    labels_ = output.dim() >= 2 ? output.size(-1) : 1;
    at::Tensor correct = (output.gt(0) == filled.gt(0.5)) & valid;
    at::Tensor per_label_correct = correct.reshape({-1, labels_}).sum(0, false, at::kDouble);
    at::Tensor per_label_count = valid.reshape({-1, labels_}).sum(0, false, at::kDouble);
    sums.push_back(sum_of(correct));
    for (int64_t i = 0; i < labels_; ++i) {
      sums.push_back(per_label_correct[i].item<double>());
      sums.push_back(per_label_count[i].item<double>());
    }
    return sums;
  }
  nlohmann::json metrics(const std::vector<double>& sums) const override {
    nlohmann::json out = mean_loss(sums);
    if (kind_ != ElementLoss::kBinaryCrossEntropyWithLogits) {
      out["mse"] = share(sums[kFirstMetric], sums[kCount]);
      add_interval(out, "mse", t_interval95(sums[kFirstMetric], sums[kFirstMetric + 2], sums[kCount]));
      out["mae"] = share(sums[kFirstMetric + 1], sums[kCount]);
      add_interval(out, "mae", t_interval95(sums[kFirstMetric + 1], sums[kFirstMetric], sums[kCount]));
      return out;
    }
    out["label_accuracy"] = share(sums[kFirstMetric], sums[kCount]);
    add_interval(out, "label_accuracy", wilson95(sums[kFirstMetric], sums[kCount]));
    nlohmann::json per_label = nlohmann::json::array();
    for (size_t i = kFirstMetric + 1; i + 1 < sums.size(); i += 2)
      per_label.push_back(share(sums[i], sums[i + 1]));
    out["per_label_accuracy"] = per_label;
    return out;
  }
  std::string headline() const override {
    return kind_ == ElementLoss::kBinaryCrossEntropyWithLogits ? "label_accuracy"
           : kind_ == ElementLoss::kSquared                      ? "mse"
                                                                 : "mae";
  }
  std::string unit() const override { return "target value"; }

 private:
  // The target as float with the output's shape; [B] targets fit a [B, 1] output.
  at::Tensor fit(const at::Tensor& output, const at::Tensor& target) const {
    at::Tensor t = target.to(output.scalar_type());
    if (t.sizes() == output.sizes()) return t;
    if (t.numel() == output.numel() && t.dim() >= 1 && output.dim() >= 1 && t.size(0) == output.size(0))
      return t.reshape(output.sizes());
    throw InputError("loss.name = " + name() + " needs targets of the output's shape; the model "
                     "gave " + shape(output) + " for targets " + shape(target));
  }
  ElementLoss kind_;
  mutable int64_t labels_ = 1;
};

// loss.name = model: the module's own loss(output, target), one value per
// sample. A sample whose target has a missing value (NaN, or a negative
// class) is left out; its target is replaced by zeros before the call, so
// the module never sees a NaN.
class ModelsOwn : public Objective {
 public:
  explicit ModelsOwn(Model& model) : Objective("model"), model_(model) {
    if (!model.has_own_loss())
      throw InputError("loss.name = model needs a loss(output, target) method on the module "
                       "(decorated with @torch.jit.export, returning one loss per sample); " +
                       model.description() + " has none");
  }

  MaskedLoss loss(const at::Tensor& output, const at::Tensor& target) const override {
    const int64_t batch = target.dim() == 0 ? 1 : target.size(0);
    at::Tensor flat = target.reshape({batch, -1});
    at::Tensor missing = target.is_floating_point() ? flat.isnan().any(1) : flat.lt(0).any(1);
    MaskedLoss out;
    out.masked = missing.sum().item<int64_t>();
    out.valid = batch - out.masked;
    at::Tensor filled = out.masked == 0 ? target
                                        : target.masked_fill(missing.reshape({batch}).view(
                                                                 broadcast_shape(target)), 0);
    at::Tensor each = model_.own_loss(output, filled);
    if (each.dim() != 1 || each.size(0) != batch)
      throw InputError(model_.description() + ": loss(output, target) returned " + shape(each) +
                       "; one loss per sample, [" + std::to_string(batch) + "], is needed (use "
                       "reduction='none' and reduce the other dimensions)");
    each = each.to(at::kFloat);
    out.sum = out.masked == 0 ? each.sum() : (each * (~missing).to(at::kFloat)).sum();
    return out;
  }
  std::vector<double> metric_sums(const at::Tensor& output, const at::Tensor& target) const override {
    MaskedLoss l = loss(output, target);
    return {l.sum.item<double>(), double(l.valid)};
  }
  nlohmann::json metrics(const std::vector<double>& sums) const override { return mean_loss(sums); }
  std::string headline() const override { return "loss"; }
  std::string unit() const override { return "sample"; }

 private:
  static std::vector<int64_t> broadcast_shape(const at::Tensor& target) {
    std::vector<int64_t> dims(size_t(std::max<int64_t>(1, target.dim())), 1);
    dims[0] = target.dim() == 0 ? 1 : target.size(0);
    return dims;
  }
  Model& model_;
};

}  // namespace

std::unique_ptr<Objective> make_objective(const LossSection& loss, Model& model) {
  if (loss.name == "cross_entropy") return std::make_unique<CrossEntropy>(loss.label_smoothing);
  if (loss.name == "mse") return std::make_unique<ElementWise>("mse", ElementLoss::kSquared);
  if (loss.name == "l1") return std::make_unique<ElementWise>("l1", ElementLoss::kAbsolute);
  if (loss.name == "bce_with_logits")
    return std::make_unique<ElementWise>("bce_with_logits", ElementLoss::kBinaryCrossEntropyWithLogits);
  if (loss.name == "model") return std::make_unique<ModelsOwn>(model);
  throw InputError("loss.name = " + loss.name +
                   " (allowed: cross_entropy, mse, l1, bce_with_logits, model)");
}

}  // namespace lockstep

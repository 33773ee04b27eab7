#include "runtime/loss/masked_loss.h"

#include <torch/torch.h>

namespace lockstep {

MaskedLoss masked_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels,
                                    double label_smoothing) {
  at::Tensor valid = labels.is_floating_point() ? ~labels.isnan() : labels.ge(0);
  MaskedLoss out;
  out.valid = valid.sum().item<int64_t>();
  out.masked = labels.numel() - out.valid;
  if (out.valid == 0) {
    out.sum = (logits * 0).sum();  // keeps the graph: every gradient is exactly zero
    return out;
  }
  at::Tensor targets = labels.masked_select(valid).to(at::kLong);
  at::Tensor chosen = out.masked == 0 ? logits : logits.index({valid});
  out.sum = torch::nn::functional::cross_entropy(
      chosen, targets,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum).label_smoothing(
          label_smoothing));
  return out;
}

MaskedLoss masked_elementwise_sum(const at::Tensor& output, const at::Tensor& target, ElementLoss kind) {
  at::Tensor valid = ~target.isnan();
  MaskedLoss out;
  out.valid = valid.sum().item<int64_t>();
  out.masked = target.numel() - out.valid;
  // Missing values are replaced before the loss, not after: a NaN that
  // entered the graph would turn the gradient into NaN even when masked.
  at::Tensor filled = out.masked == 0 ? target : target.masked_fill(~valid, 0.0);
  at::Tensor each;
  switch (kind) {
    case ElementLoss::kSquared: each = (output - filled).pow(2); break;
    case ElementLoss::kAbsolute: each = (output - filled).abs(); break;
    case ElementLoss::kBinaryCrossEntropyWithLogits:
      each = torch::binary_cross_entropy_with_logits(output, filled, {}, {}, at::Reduction::None);
      break;
  }
  out.sum = out.masked == 0 ? each.sum() : (each * valid.to(each.scalar_type())).sum();
  return out;
}

}  // namespace lockstep

#include "runtime/masked_loss.h"

#include <torch/torch.h>

namespace lockstep {

MaskedLoss masked_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) {
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
      chosen, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  return out;
}

}  // namespace lockstep

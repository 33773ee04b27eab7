#pragma once
// Losses that leave out missing targets instead of learning from them:
// integer class labels < 0 and NaN float values are "missing".
#include <cstdint>

#include <ATen/core/Tensor.h>

namespace lockstep {

struct MaskedLoss {
  at::Tensor sum;      // sum of the losses over valid targets (0 if none)
  int64_t valid = 0;   // targets counted (samples, or values for element-wise losses)
  int64_t masked = 0;  // targets left out
};

// `logits` [B, C]; `labels` [B], int64 (-1 = missing) or floating (NaN =
// missing). The returned sum is differentiable; with no valid target its
// gradient is zero everywhere. `label_smoothing` as in PyTorch.
MaskedLoss masked_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels,
                                    double label_smoothing = 0.0);

enum class ElementLoss { kSquared, kAbsolute, kBinaryCrossEntropyWithLogits };

// Element-wise loss of `output` against float `target` of the same shape,
// NaN targets left out element by element; valid counts target values.
MaskedLoss masked_elementwise_sum(const at::Tensor& output, const at::Tensor& target, ElementLoss kind);

}  // namespace lockstep

#pragma once
// Cross-entropy that leaves out missing targets instead of turning them
// into a class: integer labels < 0 and NaN float labels are "missing".
#include <cstdint>

#include <ATen/core/Tensor.h>

namespace lockstep {

struct MaskedLoss {
  at::Tensor sum;      // sum of per-sample losses over valid targets (0 if none)
  int64_t valid = 0;   // samples with a target
  int64_t masked = 0;  // samples left out
};

// `logits` [B, C]; `labels` [B], int64 (-1 = missing) or floating (NaN =
// missing). The returned sum is differentiable; with no valid target its
// gradient is zero everywhere.
MaskedLoss masked_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace lockstep

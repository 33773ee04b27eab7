#pragma once
// Clip-by-global-norm that is safe when gradients share storage. Two
// parameters whose .grad tensors alias the same memory (a fused buffer, a
// compiler's reuse) would be counted twice in the norm and scaled twice by a
// per-tensor clip; this one counts and scales every storage element once.
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace lockstep::optim {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct ClipResult {
  double total_norm = 0.0;  // L2 norm over every distinct gradient element
  bool clipped = false;     // gradients were scaled by max_norm / total_norm
  int64_t nonfinite = 0;    // distinct gradient elements that are inf or NaN
  // Names of parameters whose gradients overlap in one storage, one group
  // each (disjoint slices of one buffer are not sharing).
  std::vector<std::vector<std::string>> shared_storage;
};

// Scales gradients in place so their global L2 norm is at most max_norm
// (max_norm <= 0: only measures). With a non-finite norm nothing is scaled.
// Parameters without a gradient are skipped.
ClipResult clip_grad_norm(const NamedTensors& params, double max_norm);

}  // namespace lockstep::optim

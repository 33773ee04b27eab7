#pragma once
// One microbatch computed again on this rank as its owner computed it (the
// cross-check of audit.verify_every): the same seed, parameters and
// buffers, so with the same kernels the same bits. Nothing of the run is
// touched: not .grad (the reducer's buckets), not the random streams; the
// caller keeps the buffers aside (BufferPolicy::aside).
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/audit/step_evidence.h"
#include "runtime/data/batches.h"
#include "runtime/loss/objective.h"
#include "runtime/model/model.h"

namespace lockstep {

struct Recomputed {
  MicrobatchDigest digest;
  std::vector<at::Tensor> gradients;  // one per parameter, as accumulated into zeroed buffers
};

// `batch` on the model's device; `step` 1-based; `seed` the microbatch's
// (microbatch_seed); `loss_scale` the gradient scaler's scale (1: none).
Recomputed recompute_microbatch(Model& model, const Objective& objective, const NamedTensors& parameters,
                                const Batch& batch, int64_t step, uint64_t seed, at::ScalarType autocast,
                                double loss_scale);

// The gradients the reducer holds after a microbatch's backward, one per
// parameter (views, not copies).
std::vector<at::Tensor> current_gradients(const NamedTensors& parameters);

}  // namespace lockstep

#pragma once
// Gradient all-reduce in buckets: the mean over the global batch.
// Gradients are grouped in the reverse order of parameter registration
// (the order backward produces them), the first bucket small, the others
// up to bucket_bytes. Each rank's gradients are sums over its valid
// samples; the reducer sums them and the sample counts over ranks and
// divides by the global count, so W ranks with batch B give the gradient of
// one process with batch W*B, masked targets included.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/process_group.h"

namespace lockstep {

struct ReducerOptions {
  int64_t bucket_bytes = 25 << 20;       // gradients per all-reduce
  int64_t first_bucket_bytes = 1 << 20;  // small, so the first can start early
};

class GradientReducer {
 public:
  // `params` must be in registration order; every parameter needs
  // requires_grad. The group must outlive the reducer.
  GradientReducer(std::vector<std::pair<std::string, at::Tensor>> params, CollectiveGroup& group,
                  ReducerOptions options);

  // Sums every gradient and `local_count` over ranks and divides the
  // gradients by the global count. A parameter without a gradient counts as
  // zeros (and gets a zero gradient). Returns the global count; with a
  // global count of 0 the gradients are left as summed (all zero).
  double allreduce_mean(double local_count);

  // Parameter names per bucket, first bucket first (for the log).
  std::vector<std::vector<std::string>> bucket_names() const;
  int64_t bucket_count() const { return int64_t(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_
    at::Tensor flat;              // members' gradients, back to back (+1 count slot in the last)
  };
  std::vector<std::pair<std::string, at::Tensor>> params_;
  CollectiveGroup& group_;
  std::vector<Bucket> buckets_;
};

}  // namespace lockstep

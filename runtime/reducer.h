#pragma once
// Gradient all-reduce in buckets: the mean over the global batch.
// Gradients are grouped in the reverse order of parameter registration
// (about the order backward produces them), the first bucket small, the
// others up to bucket_bytes. Each rank back-propagates the sum of its
// per-sample losses; the reducer sums gradients and valid-sample counts over
// ranks and divides by the global count, so W ranks with batch B give the
// gradient of one process with batch W*B, masked targets included.
//
// With overlap, a hook on every parameter copies its gradient into its
// bucket as backward produces it; on the last microbatch of a step a
// bucket's all-reduce starts as soon as its last gradient is in, buckets
// always in index order so every rank issues the same collectives in the
// same order. finish() starts whatever backward did not (a parameter that
// got no gradient counts as zeros and is named once in the log), waits, and
// writes the averaged gradients into .grad.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/process_group.h"

namespace lockstep {

struct ReducerOptions {
  int64_t bucket_bytes = 25 << 20;       // gradients per all-reduce
  int64_t first_bucket_bytes = 1 << 20;  // small, so the first can start early
  bool overlap = true;                   // start all-reduces during backward
};

class GradientReducer {
 public:
  // `params` in registration order, each with requires_grad. The group
  // must outlive the reducer. Not thread-safe beyond autograd's own calls.
  GradientReducer(std::vector<std::pair<std::string, at::Tensor>> params, CollectiveGroup& group,
                  ReducerOptions options);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Before the backward pass of microbatch `micro` (0-based) of `count`.
  // `local_count` is this rank's valid samples in the step's microbatches
  // up to and including this one.
  void begin_microbatch(int64_t micro, int64_t count, double local_count);

  // After the last backward of the step: completes the all-reduce and
  // writes sum / global count into every .grad. Returns the global count
  // (0: no valid target anywhere; the gradients are then all zero).
  double finish();

  // begin_microbatch(0, 1, local_count) + finish() for gradients already
  // in .grad (no hooks involved): the plain, non-overlapped path.
  double allreduce_mean(double local_count);

  // Non-finite values among the gradients finish() produced (one pass over
  // the flat buckets; an exact count only when there are some).
  int64_t nonfinite_count() const;

  std::vector<std::vector<std::string>> bucket_names() const;
  int64_t bucket_count() const { return int64_t(buckets_.size()); }
  // Buckets whose all-reduce started during backward in the last step.
  int64_t launched_during_backward() const { return launched_early_; }
  // Over all steps so far: the share of gradient bytes whose all-reduce had
  // already finished when backward ended (fully hidden behind it).
  double hidden_share() const {
    return bytes_reduced_ > 0 ? double(bytes_hidden_) / double(bytes_reduced_) : 0.0;
  }

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_
    at::Tensor flat;              // members' gradients, back to back (+1 count slot in the last)
    int64_t waiting = 0;          // members without a gradient yet in this microbatch
    bool launched = false;
    std::vector<at::Tensor> io;   // what the all-reduce works on
    std::optional<PendingCollective> work;
  };
  struct Place {
    size_t bucket = 0;
    int64_t offset = 0;
  };

  void on_gradient(size_t index, const at::Tensor& grad);
  void launch_ready();
  void launch(Bucket& bucket);

  std::vector<std::pair<std::string, at::Tensor>> params_;
  CollectiveGroup& group_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<Place> places_;
  std::vector<bool> arrived_;       // per parameter, this microbatch
  std::vector<bool> ever_arrived_;  // per parameter, this step
  std::vector<unsigned> hooks_;     // hook handles, per parameter
  size_t next_launch_ = 0;
  bool last_microbatch_ = true;
  bool hooked_step_ = false;        // gradients came through the hooks this step
  int64_t launched_early_ = 0;
  bool reported_unused_ = false;
  int64_t bytes_reduced_ = 0;
  int64_t bytes_hidden_ = 0;
};

}  // namespace lockstep

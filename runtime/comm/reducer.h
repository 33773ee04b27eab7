#pragma once
// Gradient all-reduce in buckets: the mean over the global batch.
// Gradients are grouped in the reverse order of parameter registration
// (about the order backward produces them), the first bucket small, the
// others up to bucket_bytes. Each rank back-propagates the sum of its
// per-sample losses; the reducer sums gradients and valid-sample counts over
// ranks and divides by the global count, so W ranks with batch B give the
// gradient of one process with batch W*B, masked targets included.
//
// Every parameter's .grad is a view into its bucket, so autograd accumulates
// straight into the buffer the all-reduce sends and the mean is taken in
// place: no copy of the model's gradients per step. The reducer owns zeroing
// them (begin_microbatch of microbatch 0); nothing else may replace .grad.
// All buckets are consecutive slices of one buffer; without overlap they go
// out as one all-reduce (on a machine where each collective costs a wake-up,
// fewer is faster), with overlap one per bucket on every rank. The parameters themselves move into one buffer of the same layout
// (the model keeps its tensors; their memory is now a slice of it), so an
// optimizer updates the whole model with a few operations (flat()).
// A hook after each parameter's gradient accumulator records its arrival;
// with overlap, on the last microbatch of a step a bucket's all-reduce starts
// as soon as its last gradient is in, buckets always in index order so every
// rank issues the same collectives in the same order. finish() starts
// whatever backward did not, so no rank ever waits for a gradient that never
// comes. One backward per microbatch.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/comm/process_group.h"

namespace torch::autograd {
struct Node;
}

namespace lockstep {

struct ReducerOptions {
  int64_t bucket_bytes = 25 << 20;       // gradients per all-reduce
  int64_t first_bucket_bytes = 1 << 20;  // small, so the first can start early
  bool overlap = true;                   // start all-reduces during backward
  // A parameter without a gradient in a step (on any rank): finish() throws
  // naming it (true), or it counts as zeros and is named once (false).
  bool error_on_unused = true;
};

class GradientReducer {
 public:
  // `params` in registration order, each with requires_grad. Gradients
  // already in .grad are kept (copied into the buckets). The group must
  // outlive the reducer. Not thread-safe beyond autograd's own calls.
  GradientReducer(std::vector<std::pair<std::string, at::Tensor>> params, CollectiveGroup& group,
                  ReducerOptions options);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Before the backward pass of microbatch `micro` (0-based) of `count`;
  // microbatch 0 zeroes the gradients. `local_count` is this rank's valid
  // samples in the step's microbatches up to and including this one;
  // `local_loss_sum` and `local_samples` likewise (the loss over them, and
  // every sample seen, valid or not): they ride along and are summed over
  // ranks (global_loss_sum(), global_samples()).
  void begin_microbatch(int64_t micro, int64_t count, double local_count,
                        double local_loss_sum = 0.0, double local_samples = 0.0);

  // After the last backward of the step: completes the all-reduce and
  // leaves sum / global count in every .grad. Returns the global count
  // (0: no valid target anywhere; the gradients are then all zero). Throws
  // RunError on every rank when a parameter got no gradient on some rank
  // and error_on_unused is set, after the collectives, so nobody hangs.
  double finish();

  // For gradients written into .grad without a backward pass (tests,
  // benchmarks): takes them as they are, then finish().
  double allreduce_mean(double local_count);

  // This rank asks that the run stop after the current step. Call it
  // before the step's last backward (its flag travels with the last
  // bucket); after finish(), stop_agreed() is true on every rank if any
  // rank asked in this step, false on every rank otherwise: one answer,
  // with no collective of its own.
  void ask_to_stop() { asking_to_stop_ = true; }
  bool stop_agreed() const { return stop_agreed_; }
  // After finish(): the loss sum and the samples of the step over all ranks.
  double global_loss_sum() const { return global_loss_sum_; }
  double global_samples() const { return global_samples_; }

  // Non-finite values among the gradients finish() produced (one pass over
  // the flat buckets; an exact count only when there are some).
  int64_t nonfinite_count() const;

  // Every parameter and every gradient, 1-D, in the same layout.
  std::pair<at::Tensor, at::Tensor> flat() const;

  std::vector<std::vector<std::string>> bucket_names() const;
  int64_t bucket_count() const { return int64_t(buckets_.size()); }
  // Buckets whose all-reduce started during backward in the last step.
  int64_t launched_during_backward() const { return launched_early_; }
  // All-reduces issued in the last step (ready neighbours share one).
  int64_t collectives_last_step() const { return collectives_; }
  // Over all steps so far: the share of gradient bytes whose all-reduce had
  // already finished when backward ended (fully hidden behind it).
  double hidden_share() const {
    return bytes_reduced_ > 0 ? double(bytes_hidden_) / double(bytes_reduced_) : 0.0;
  }

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_
    int64_t start = 0;            // first element in gradients_ / parameters_
    int64_t length = 0;           // members' elements (the last bucket's span adds the tail)
    int64_t waiting = 0;          // members without a gradient yet in this microbatch
    bool launched = false;
    std::optional<PendingCollective> work;  // shared with the neighbours sent along
  };
  struct Place {
    size_t bucket = 0;
    int64_t offset = 0;  // in gradients_ / parameters_
  };
  // Slots after the last gradient of the last bucket, summed over ranks.
  enum TailSlot : int64_t {
    kValidCount = 0,
    kRanksMissingGradients = 1,
    kRanksAskingToStop = 2,
    kLossSum = 3,
    kSamples = 4,
    kTailSlots = 5
  };

  at::Tensor slot_of(size_t index) const;
  void start_step(bool zero_gradients);
  void bind_gradients(bool keep_values);
  void on_gradient(size_t index);
  void launch_ready();
  void launch(size_t first, size_t end);  // buckets [first, end) as one all-reduce
  at::Tensor tail_slot(int64_t slot) const;
  std::string missing_gradients() const;

  std::vector<std::pair<std::string, at::Tensor>> params_;
  bool asking_to_stop_ = false;
  double global_loss_sum_ = 0.0;
  double global_samples_ = 0.0;
  bool stop_agreed_ = false;
  CollectiveGroup& group_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<Place> places_;
  at::Tensor gradients_;    // every bucket, in bucket order, then the tail slots
  at::Tensor parameters_;   // the same layout, without the tail
  std::vector<at::Tensor> io_;  // spans in flight this step (kept alive until finish)
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  std::vector<bool> arrived_;       // per parameter, this microbatch
  std::vector<bool> ever_arrived_;  // per parameter, this step
  std::string late_gradient_;       // a gradient accumulated after its bucket was sent
  size_t next_launch_ = 0;
  bool last_microbatch_ = true;
  int64_t launched_early_ = 0;
  int64_t collectives_ = 0;
  bool reported_unused_ = false;
  int64_t bytes_reduced_ = 0;
  int64_t bytes_hidden_ = 0;
};

}  // namespace lockstep

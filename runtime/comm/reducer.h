#pragma once
// Gradient all-reduce in buckets: the mean over the global batch, summed in
// float (today's path) or exactly (the same bits on any world size).
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
  // Exact summation (comm.summation = exact): each microbatch's gradient
  // goes onto one integer grid per bucket and the step's sum over all
  // microbatches of all ranks is taken in 64-bit integers, so the result
  // does not depend on the world size, on which rank computed what or on
  // the order anything arrived. A bucket's grid is set by the step's largest
  // magnitude (exponent histograms ride along with the sums); the previous
  // step's grid is used ahead, and a bucket whose largest magnitude changed
  // its class is summed again on its own. The loss sum and counts that ride
  // along go on a fixed grid of 2^-32. `microbatches_per_step` is the job's
  // k (all ranks together); it sizes the grid's headroom.
  bool exact = false;
  int64_t microbatches_per_step = 1;
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

  // Before the backward pass of microbatch `micro` (0-based) of `count`
  // on this rank; microbatch 0 zeroes the gradients. `valid`, `loss_sum`
  // and `samples` are this microbatch's own: its valid targets, the loss
  // over them, and every sample seen, valid or not. They ride along and are
  // summed over every microbatch of every rank (global_loss_sum(),
  // global_samples(), finish()'s count).
  void begin_microbatch(int64_t micro, int64_t count, double valid, double loss_sum = 0.0,
                        double samples = 0.0);

  // Exact summation only: after each microbatch's backward, its gradient
  // is set aside and the buffers zeroed for the next.
  void end_microbatch();

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
  // Exact summation: steps whose grid had to be set again (the first, and
  // where a bucket's largest magnitude jumped past its predicted grid).
  int64_t regrids() const { return regrids_; }
  // Bytes handed to all-reduces so far (both rounds of exact summation,
  // its histograms and tail included); a ring sends about 2(W-1)/W of them per rank.
  int64_t bytes_reduced() const { return bytes_reduced_; }
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
  // The sums of the step over all ranks, exactly (options_.exact), into
  // gradients_ and its tail slots.
  void reduce_exactly();
  // Exact: sums_, grid_ and largest_ sized for this model.
  void prepare_exact();
  // Adds bucket b of one microbatch's gradients to sums_ on its current grid.
  void quantize_bucket(const at::Tensor& microbatch, size_t b);
  // Adds one microbatch's counts and loss sum (its tail) to sums_.
  void quantize_tail(const at::Tensor& microbatch);
  // Bucket b of the step's last microbatch onto its grid and into its
  // all-reduce (the last bucket with the tail and the histograms).
  void launch_exact(size_t b);
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
  // Exact summation's state within a step (nothing carries over to the
  // next but the grids it starts on, which only save an all-reduce).
  std::vector<at::Tensor> held_;  // this step's earlier microbatches, each with its tail (for a redo)
  at::Tensor sums_;               // int64 sums on the grids, the tail, the histograms (host)
  std::vector<int> grid_;         // each bucket's grid exponent
  std::vector<double> largest_;   // each bucket's largest magnitude on this rank this step
  std::vector<bool> fresh_;       // a bucket whose sums hold nothing of this step yet
  bool loss_nonfinite_ = false;
  int64_t regrids_ = 0;           // steps that needed a second all-reduce
  double counted_[3] = {0, 0, 0};  // float: valid, loss sum, samples so far this step
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

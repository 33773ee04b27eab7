#pragma once
// What happens to a model's buffers (BatchNorm running statistics,
// counters) across ranks, per comm.buffers:
//   mean       every microbatch's forward starts from the step's buffers;
//              the step applies the mean of the microbatches' changes,
//              summed exactly (exact_sum.h): the same bits at any world
//              size, and for a running mean the change one forward over
//              the whole global batch would make (the default with
//              comm.summation = exact)
//   broadcast  every rank takes rank 0's (PyTorch DDP's default; done after
//              each step, which for the next forward is the same as before it)
//   average    floating buffers become the mean over ranks; integer ones
//              (num_batches_tracked) rank 0's
//   local      each rank keeps its own; they are expected to differ
// After sync() the buffers are what the audit, the evaluation, checkpoints
// and the saved model see. One collective per dtype; every rank must call
// sync() together.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/model/model.h"
#include "runtime/comm/process_group.h"

namespace lockstep {

class BufferPolicy {
 public:
  // `policy` is comm.buffers: auto is mean with `summation` = exact (the
  // rule that keeps its bits), broadcast with float.
  BufferPolicy(const std::string& policy, const std::string& summation, NamedTensors buffers,
               CollectiveGroup& group);
  // Around each microbatch's forward (mean only; nothing otherwise):
  // `micro` counts this rank's microbatches in the step from 0.
  void begin_microbatch(int64_t micro);
  void end_microbatch();
  // After the step's microbatches: `total_microbatches` is k, every rank's together.
  void sync(int64_t total_microbatches = 1);
  // A step that will not finish (a lost peer, the generation ended): the
  // buffers go back to how the step found them, as the parameters are.
  void abandon_step();
  // Runs `compute` (a microbatch computed again, to check another rank's)
  // from the buffers the step's microbatches start from, and puts back
  // what was there: the step goes on as if it had not run.
  void aside(const std::function<void()>& compute);
  // Runs `evaluate` with rank 0's buffers on every rank, so that the
  // figures reported are those of the model rank 0 saves. Under local each
  // rank's own buffers are put back after; otherwise they are rank 0's already.
  template <typename Evaluate>
  auto as_saved(Evaluate&& evaluate) {
    if (policy_ != "local" || buffers_.empty() || group_.size() == 1) return evaluate();
    const std::vector<at::Tensor> own = take_rank_zero_buffers();
    auto result = evaluate();
    restore(own);
    return result;
  }
  // For the decision log: what is done and why.
  std::string value() const;
  std::string reason() const;
  bool active() const { return policy_ != "local" && !buffers_.empty(); }
  // A policy that makes the buffers, and through them the bits, depend on
  // the world size although the sums are exact: the decision is a warning.
  bool ties_bits_to_world_size() const { return summation_ == "exact" && policy_ != "mean" && !buffers_.empty(); }

 private:
  std::vector<at::Tensor> take_rank_zero_buffers();  // returns copies of this rank's own
  void restore(const std::vector<at::Tensor>& own);
  void broadcast_all();

  void apply_mean_change(int64_t total_microbatches);
  std::string rule() const;  // what policy_ does, for reason()

  std::string asked_;      // comm.buffers as set
  std::string summation_;  // comm.summation
  std::string policy_;     // what auto resolved to
  NamedTensors buffers_;
  std::vector<at::Tensor> step_start_;   // mean: the buffers as the step found them
  std::vector<at::Tensor> changes_;      // mean: each microbatch's change, flat, in double
  CollectiveGroup& group_;
};

}  // namespace lockstep

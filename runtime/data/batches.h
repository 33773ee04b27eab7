#pragma once
// This rank's stream of training microbatches, step after step: of each
// step's global batch (GlobalBatchSampler) the contiguous block of k / W
// microbatches that rank r of W computes, r * k / W first. Every batch owns
// fresh tensors, so a batch kept for gradient accumulation is never
// overwritten by the next one. With prefetch > 0 a background thread
// assembles up to that many batches ahead (same order), so gathering rows
// stays off the training thread.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>


#include "runtime/data/dataset.h"
#include "runtime/data/sampler.h"

namespace lockstep {

struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
  int64_t epoch = 0;
  int64_t step = 0;        // the optimizer step it belongs to (0-based)
  int64_t microbatch = 0;  // its index j in that step's global batch, whichever rank computes it
};

class Augmenter;
class BatchStream {
 public:
  // Starts at step `first_step` (resuming where a checkpoint left).
  // `augmenter` (may be null) changes each batch's inputs by the batch's
  // global index (step * k + microbatch): the same draws on any world size.
  // `pin_memory`: batches come in page-locked host memory, ready for an
  // asynchronous copy to a GPU (pinned on the background thread when there is one).
  BatchStream(const Dataset& data, int rank, int world_size, uint64_t seed, int64_t global_batch,
              int64_t microbatch, int prefetch = 0, int64_t first_step = 0,
              const Augmenter* augmenter = nullptr, bool pin_memory = false);
  ~BatchStream();
  BatchStream(const BatchStream&) = delete;
  BatchStream& operator=(const BatchStream&) = delete;
  // The next batch; rethrows a failure of the background thread.
  Batch next();
  // Microbatch j of step `step` (0-based), whichever rank's it is, built
  // now on the calling thread (a rank recomputing another's, to check it).
  // Only from the thread that calls next().
  Batch assemble_at(int64_t step, int64_t j);
  // Optimizer steps per epoch (floor of samples / global batch).
  int64_t steps_per_epoch() const { return sampler_.steps_per_epoch(); }

 private:
  Batch assemble();  // the next batch, on whichever thread asks
  Batch build(GlobalBatchSampler& sampler, int64_t step, int64_t j) const;
  void produce();    // the background thread


  const Dataset& data_;
  GlobalBatchSampler sampler_;
  GlobalBatchSampler lookup_sampler_;  // assemble_at's: the producer thread owns sampler_
  int64_t per_rank_;        // microbatches of a step on this rank: k / W
  int64_t first_index_;     // this rank's first microbatch of a step: r * k / W
  int64_t step_ = 0, local_ = 0;  // of the next batch assembled
  const Augmenter* augmenter_ = nullptr;

  const int prefetch_;
  const bool pin_memory_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> ready_;        // guarded by mutex_
  bool stopping_ = false;          // guarded by mutex_
  std::exception_ptr failure_;     // guarded by mutex_
  std::thread producer_;
};

}  // namespace lockstep

#pragma once
// This rank's stream of training microbatches, epoch after epoch, in the
// order DistributedSampler gives. Every batch owns fresh tensors, so a batch
// kept for gradient accumulation is never overwritten by the next one. With
// prefetch > 0 a background thread assembles up to that many batches ahead
// (same order), so gathering rows stays off the training thread.
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
};

class Augmenter;
class BatchStream {
 public:
  // `skip` batches are passed over first (resuming where a checkpoint left).
  // `augmenter` (may be null) changes each batch's inputs by its index in this stream.
  // `pin_memory`: batches come in page-locked host memory, ready for an
  // asynchronous copy to a GPU (pinned on the background thread when there is one).
  BatchStream(const Dataset& data, int rank, int world_size, uint64_t seed, int64_t batch_size,
              int prefetch = 0, int64_t skip = 0, const Augmenter* augmenter = nullptr,
              bool pin_memory = false);
  ~BatchStream();
  BatchStream(const BatchStream&) = delete;
  BatchStream& operator=(const BatchStream&) = delete;
  // The next batch; rethrows a failure of the background thread.
  Batch next();
  // Batches per epoch on this rank (the last one may be smaller).
  int64_t batches_per_epoch() const;

 private:
  void start_epoch(int64_t epoch);
  Batch assemble();  // the next batch, on whichever thread asks
  void produce();    // the background thread


  const Dataset& data_;
  DistributedSampler sampler_;
  int64_t batch_size_;
  int64_t epoch_ = -1;
  at::Tensor order_;     // this epoch's indices
  int64_t position_ = 0;
  const Augmenter* augmenter_ = nullptr;
  int64_t next_index_ = 0;  // of the next batch assembled, in this rank's stream

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

#pragma once
// Splits an epoch across ranks the way DistributedSampler does, but with a
// permutation that depends only on (seed, epoch): rank r takes positions
// r, r + W, r + 2W, ... of it. The permutation is padded by repeating its
// head so that every rank gets ceil(N / W) samples and the union over ranks
// is the whole epoch for any world size. With this striding, the global
// batch t of W ranks with batch B is positions [tWB, (t+1)WB) of the
// permutation: exactly the batch t of one process with batch W*B.
#include <cstdint>
#include <vector>

namespace lockstep {

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int rank, int world_size, uint64_t seed);

  // This rank's sample indices for `epoch`, in order.
  std::vector<int64_t> indices(int64_t epoch) const;
  int64_t samples_per_rank() const { return per_rank_; }

  // The shared permutation of [0, N) for `epoch` (no padding).
  static std::vector<int64_t> permutation(int64_t size, uint64_t seed, int64_t epoch);

 private:
  int64_t size_;
  int rank_;
  int world_size_;
  uint64_t seed_;
  int64_t per_rank_;
};

// The work of each optimizer step, whatever the world size: step s of
// epoch e = s / steps_per_epoch takes positions [t G, (t + 1) G) of epoch
// e's permutation (t = s mod steps_per_epoch, G = global_batch), and
// microbatch j of it the m = microbatch positions [t G + j m, t G + (j+1) m).
// An epoch has floor(N / G) steps: the N mod G samples left at its end
// (others each epoch) are not trained on in it. Which rank computes a
// microbatch is not its business.
class GlobalBatchSampler {
 public:
  GlobalBatchSampler(int64_t dataset_size, uint64_t seed, int64_t global_batch, int64_t microbatch);
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t microbatches_per_step() const { return global_batch_ / microbatch_; }
  int64_t epoch_of(int64_t step) const { return step / steps_per_epoch_; }
  // The sample indices of microbatch j of step `step`, in order. Not thread-safe
  // (it keeps the current epoch's permutation).
  std::vector<int64_t> microbatch(int64_t step, int64_t j);

 private:
  int64_t size_, global_batch_, microbatch_, steps_per_epoch_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> permutation_;
};

}  // namespace lockstep

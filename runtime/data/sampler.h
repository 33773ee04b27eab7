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

}  // namespace lockstep

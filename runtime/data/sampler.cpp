#include "runtime/data/sampler.h"

#include <stdexcept>
#include <string>

namespace lockstep {
namespace {

// splitmix64: a small, fully specified generator, so the data order is the
// same on every platform and standard library.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size,
                                       uint64_t seed)
    : size_(dataset_size), rank_(rank), world_size_(world_size), seed_(seed) {
  if (dataset_size <= 0 || world_size <= 0 || rank < 0 || rank >= world_size)
    throw std::invalid_argument("DistributedSampler: need size > 0 and 0 <= rank < world_size "
                                "(size " + std::to_string(dataset_size) + ", rank " +
                                std::to_string(rank) + ", world " + std::to_string(world_size) +
                                ")");
  per_rank_ = (size_ + world_size_ - 1) / world_size_;
}

std::vector<int64_t> DistributedSampler::permutation(int64_t size, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) perm[size_t(i)] = i;
  uint64_t state = seed * 0x100000001b3ULL ^ (uint64_t(epoch) + 0x51ed270b27a3c5c5ULL);
  for (int64_t i = size - 1; i > 0; --i) {
    // Unbiased bounded draw (rejection of the short tail).
    uint64_t bound = uint64_t(i) + 1, limit = UINT64_MAX - UINT64_MAX % bound, draw;
    do draw = splitmix64(state);
    while (draw >= limit);
    std::swap(perm[size_t(i)], perm[size_t(draw % bound)]);
  }
  return perm;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> perm = permutation(size_, seed_, epoch);
  std::vector<int64_t> mine;
  mine.reserve(size_t(per_rank_));
  for (int64_t k = 0; k < per_rank_; ++k) {
    int64_t position = k * world_size_ + rank_;
    mine.push_back(perm[size_t(position % size_)]);  // past the end: the padded head
  }
  return mine;
}

GlobalBatchSampler::GlobalBatchSampler(int64_t dataset_size, uint64_t seed, int64_t global_batch,
                                       int64_t microbatch)
    : size_(dataset_size), global_batch_(global_batch), microbatch_(microbatch), seed_(seed) {
  if (microbatch <= 0 || global_batch <= 0 || global_batch % microbatch != 0 || global_batch > dataset_size)
    throw std::invalid_argument("GlobalBatchSampler: need 0 < microbatch | global_batch <= size (size " +
                                std::to_string(dataset_size) + ", global batch " + std::to_string(global_batch) +
                                ", microbatch " + std::to_string(microbatch) + ")");
  steps_per_epoch_ = size_ / global_batch_;
}

std::vector<int64_t> GlobalBatchSampler::microbatch(int64_t step, int64_t j) {
  const int64_t epoch = epoch_of(step);
  if (epoch != epoch_) {
    permutation_ = DistributedSampler::permutation(size_, seed_, epoch);
    epoch_ = epoch;
  }
  const int64_t start = (step % steps_per_epoch_) * global_batch_ + j * microbatch_;
  return std::vector<int64_t>(permutation_.begin() + start, permutation_.begin() + start + microbatch_);
}

}  // namespace lockstep

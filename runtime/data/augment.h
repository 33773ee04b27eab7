#pragma once
// Augmentation of training batches (data.augment), drawn from each rank's
// own random stream: different on every rank (its training seed is
// job.seed + rank), identical across reruns, and identical across a
// kill-and-resume. The stream is counter-based: the draws for a batch come
// from a generator seeded by (the rank's training seed, the batch's index
// in this rank's stream), so the checkpoint's count of batches done is the
// whole of its state. Inputs are [B, C, H, W] (or [B, H, W]).
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace lockstep {

struct AugmentStep {
  std::string kind;  // random_crop | hflip
  int64_t padding = 0;  // random_crop: pad by this on each side, then crop back
};

// "random_crop:4, hflip" -> steps. Throws InputError naming the item and
// the allowed forms.
std::vector<AugmentStep> parse_augment(const std::string& text);

class Augmenter {
 public:
  Augmenter(std::vector<AugmentStep> steps, uint64_t rank_seed);
  bool active() const { return !steps_.empty(); }
  // Batch number `index` of this rank's stream, augmented (a new tensor).
  at::Tensor apply(const at::Tensor& batch, int64_t index) const;
  // A hash of the draws for batch `index` of `batch_size` samples of
  // `height` x `width`: what the seeding check compares across ranks.
  uint64_t draws_hash(int64_t index, int64_t batch_size, int64_t height, int64_t width) const;

 private:
  std::vector<int64_t> draws(int64_t index, int64_t batch_size) const;
  std::vector<AugmentStep> steps_;
  uint64_t rank_seed_;
};

}  // namespace lockstep

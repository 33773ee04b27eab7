#include "runtime/data/augment.h"

#include <sstream>

#include <torch/torch.h>

#include "runtime/base/errors.h"

namespace lockstep {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: neighbouring counters, unrelated seeds
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<AugmentStep> parse_augment(const std::string& text) {
  std::vector<AugmentStep> steps;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    const auto first = item.find_first_not_of(' '), last = item.find_last_not_of(' ');
    if (first == std::string::npos) continue;
    item = item.substr(first, last - first + 1);
    const std::string allowed = " (allowed: random_crop:P with padding P from 1 to 64, hflip)";
    if (item == "hflip") {
      steps.push_back({"hflip", 0});
      continue;
    }
    if (item.rfind("random_crop:", 0) == 0) {
      const std::string number = item.substr(12);
      size_t used = 0;
      int64_t padding = 0;
      try {
        padding = std::stoll(number, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == number.size() && !number.empty() && padding >= 1 && padding <= 64) {
        steps.push_back({"random_crop", padding});
        continue;
      }
    }
    throw InputError("data.augment item '" + item + "' is not known" + allowed);
  }
  return steps;
}

Augmenter::Augmenter(std::vector<AugmentStep> steps, uint64_t rank_seed)
    : steps_(std::move(steps)), rank_seed_(rank_seed) {}

// Per sample, per step: a flip bit, or the crop's row and column offsets.
std::vector<int64_t> Augmenter::draws(int64_t index, int64_t batch_size) const {
  uint64_t state = mix(rank_seed_ ^ mix(uint64_t(index) + 0xa0761d6478bd642fULL));
  std::vector<int64_t> out;
  for (int64_t i = 0; i < batch_size; ++i)
    for (const auto& step : steps_) {
      state = mix(state);
      if (step.kind == "hflip") {
        out.push_back(int64_t(state >> 63));
      } else {
        const uint64_t span = uint64_t(2 * step.padding + 1);
        out.push_back(int64_t((state >> 32) % span));
        out.push_back(int64_t((state & 0xffffffffULL) % span));
      }
    }
  return out;
}

at::Tensor Augmenter::apply(const at::Tensor& batch, int64_t index) const {
  if (!active()) return batch;
  if (batch.dim() < 3)
    throw InputError("data.augment needs image inputs [batch, channels, height, width] or [batch, "
                     "height, width]; the inputs are " + c10::str(batch.sizes()));
  const std::vector<int64_t> drawn = draws(index, batch.size(0));
  at::Tensor out = batch.clone();
  const int64_t h = batch.size(-2), w = batch.size(-1);
  size_t at = 0;
  for (int64_t i = 0; i < batch.size(0); ++i) {
    at::Tensor sample = out[i];
    for (const auto& step : steps_) {
      if (step.kind == "hflip") {
        if (drawn[at++]) sample.copy_(sample.flip({-1}));
        continue;
      }
      const int64_t dy = drawn[at++], dx = drawn[at++], p = step.padding;
      // Pad with zeros by p on each side, take the h x w window at (dy, dx).
      at::Tensor padded = torch::constant_pad_nd(sample, {p, p, p, p}, 0.0);
      sample.copy_(padded.narrow(-2, dy, h).narrow(-1, dx, w));
    }
  }
  return out;
}

uint64_t Augmenter::draws_hash(int64_t index, int64_t batch_size, int64_t, int64_t) const {
  uint64_t hash = 0;
  for (int64_t d : draws(index, batch_size)) hash = mix(hash ^ uint64_t(d));
  return hash;
}

}  // namespace lockstep

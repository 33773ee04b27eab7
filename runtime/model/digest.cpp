#include "runtime/model/digest.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include <torch/torch.h>
#include <xxhash.h>

namespace lockstep {

std::string TensorDigest::hex() const {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return text;
}

uint64_t hash_bytes(const void* data, size_t size) { return XXH3_64bits(data, size); }

TensorDigest digest(const at::Tensor& tensor) {
  at::Tensor t = tensor.device().is_cpu() ? tensor.detach() : tensor.detach().cpu();
  if (!t.is_contiguous()) t = t.contiguous();
  XXH128_hash_t h = XXH3_128bits(t.data_ptr(), size_t(t.numel()) * t.element_size());
  TensorDigest d;
  d.high = h.high64;
  d.low = h.low64;
  d.sum = t.numel() ? t.sum(at::kDouble).item<double>() : 0.0;  // accumulates in fp64, no copy
  return d;
}

TensorDigest bits_digest(const at::Tensor& tensor) {
  if (!tensor.device().is_cpu()) return lane_digest(tensor);
  at::Tensor t = tensor.detach();
  if (!t.is_contiguous()) t = t.contiguous();
  XXH128_hash_t h = XXH3_128bits(t.data_ptr(), size_t(t.numel()) * t.element_size());
  return TensorDigest{h.high64, h.low64, 0.0};
}

namespace {

// The tensor's elements as their bit patterns, one int64 each.
at::Tensor bit_patterns(const at::Tensor& flat) {
  switch (flat.element_size()) {
    case 8: return flat.view(at::kLong);
    case 4: return flat.view(at::kInt).to(at::kLong);
    case 2: return flat.view(at::kShort).to(at::kLong);
    case 1: return flat.view(at::kByte).to(at::kLong);
    default: throw std::invalid_argument("lane_digest: elements of " + std::to_string(flat.element_size()) + " bytes");
  }
}

// A multiply-xorshift mix per element, wrapping in 64 bits.
at::Tensor mixed(const at::Tensor& bits, const at::Tensor& positions, int64_t key, int64_t multiplier) {
  at::Tensor x = bits.mul(multiplier).add_(positions.mul(key));
  x.bitwise_xor_(x.bitwise_right_shift(29) & int64_t(0x7FFFFFFFF));
  x.mul_(multiplier);
  x.bitwise_xor_(x.bitwise_right_shift(32) & int64_t(0xFFFFFFFF));
  return x;
}

}  // namespace

TensorDigest lane_digest(const at::Tensor& tensor) {
  torch::NoGradGuard no_grad;
  at::Tensor flat = tensor.detach().contiguous().view({-1});
  if (flat.scalar_type() == at::kBool) flat = flat.view(at::kByte);
  const int64_t count = flat.numel();
  constexpr int64_t kChunk = int64_t(1) << 22;  // about 128 MiB of temporaries at most
  const auto options = flat.options().dtype(at::kLong);
  at::Tensor lanes = at::zeros({2}, options);
  for (int64_t start = 0; start < count; start += kChunk) {
    const int64_t n = std::min(kChunk, count - start);
    const at::Tensor bits = bit_patterns(flat.narrow(0, start, n));
    const at::Tensor positions = at::arange(start, start + n, options);
    lanes[0] += mixed(bits, positions, int64_t(0x632BE59BD9B4E019), int64_t(0x5851F42D4C957F2D)).sum();
    lanes[1] += mixed(bits, positions, int64_t(0x2545F4914F6CDD1D), int64_t(0x1B873593CC9E2D51)).sum();
  }
  const at::Tensor host = lanes.cpu();
  TensorDigest d;
  // The element count and size go in too: an empty tensor, or zeros of
  // another length, is not the same tensor.
  d.high = uint64_t(host[0].item<int64_t>()) ^ (uint64_t(count) * 0x9E3779B97F4A7C15ull);
  d.low = uint64_t(host[1].item<int64_t>()) ^ (uint64_t(flat.element_size()) * 0xC2B2AE3D27D4EB4Full);
  d.sum = count ? flat.sum(at::kDouble).item<double>() : 0.0;
  return d;
}

TensorDigest device_digest(const at::Tensor& tensor) {
  return tensor.device().is_cpu() ? digest(tensor) : lane_digest(tensor);
}

std::string kind_of_device_digest(const at::Tensor& tensor) {
  return tensor.device().is_cpu() ? "xxh3-128" : "lanes-128";
}

NamedDigests model_digests(const Model& model, bool buffers) {
  NamedDigests out;
  for (const auto& [name, tensor] : model.parameters()) out.emplace_back(name, digest(tensor));
  if (buffers)
    for (const auto& [name, tensor] : model.buffers()) out.emplace_back(name, digest(tensor));
  return out;
}

std::string combined_hex(const NamedDigests& digests) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  for (const auto& [name, d] : digests) {
    XXH3_128bits_update(state, name.data(), name.size());
    XXH3_128bits_update(state, &d.high, sizeof d.high);
    XXH3_128bits_update(state, &d.low, sizeof d.low);
  }
  XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return TensorDigest{h.high64, h.low64, 0.0}.hex();
}

}  // namespace lockstep

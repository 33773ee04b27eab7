#include "runtime/model/digest.h"

#include <cstdio>

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

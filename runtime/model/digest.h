#pragma once
// Digests of tensors: a 128-bit hash of the exact bytes (xxh3) and an fp64
// sum for a magnitude a person can read. Equal digests mean bit-identical
// tensors; the hash runs over the tensor's memory in place.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/model/model.h"


namespace lockstep {

struct TensorDigest {
  uint64_t high = 0;
  uint64_t low = 0;
  double sum = 0.0;
  bool operator==(const TensorDigest& o) const { return high == o.high && low == o.low; }
  bool operator!=(const TensorDigest& o) const { return !(*this == o); }
  std::string hex() const;
};

TensorDigest digest(const at::Tensor& tensor);

// Hash of raw bytes (xxh3, 64 bit).
uint64_t hash_bytes(const void* data, size_t size);

using NamedDigests = std::vector<std::pair<std::string, TensorDigest>>;

// Every parameter, and with `buffers` every buffer, by name.
NamedDigests model_digests(const Model& model, bool buffers);

// One digest over a list: its names and their hashes, in order.
std::string combined_hex(const NamedDigests& digests);

}  // namespace lockstep

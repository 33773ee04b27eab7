#pragma once
// Digests of tensors: a 128-bit hash of the exact bytes and an fp64 sum for
// a magnitude a person can read. Equal digests mean bit-identical tensors.
// Two kinds: xxh3 over the tensor's memory on the host (digest: a CUDA
// tensor is copied first), and a device digest that reads a CUDA tensor
// where it lives and brings back 16 bytes (device_digest). Digests compare
// only with digests of their own kind.
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

// xxh3-128 of the bytes, on the host (a CUDA tensor is copied there first).
TensorDigest digest(const at::Tensor& tensor);

// The bits only, where the tensor lives (no sum, no copy off a GPU):
// xxh3-128 of a CPU tensor's bytes, lane_digest of any other. For digests
// taken often (every microbatch's gradient).
TensorDigest bits_digest(const at::Tensor& tensor);

// Where the tensor lives: xxh3-128 for a CPU tensor (the same as digest),
// lane_digest for any other. kind_of_device_digest names which.
TensorDigest device_digest(const at::Tensor& tensor);
std::string kind_of_device_digest(const at::Tensor& tensor);

// Two 64-bit lanes, each the wrapping sum over elements of a mixed
// (bit pattern, position) pair, computed with tensor operations on the
// tensor's own device in chunks of bounded size: exact integer arithmetic,
// so the same bits give the same lanes on any device and in any summation
// order. Any change of one element changes the lanes.
TensorDigest lane_digest(const at::Tensor& tensor);

// Hash of raw bytes (xxh3, 64 bit).
uint64_t hash_bytes(const void* data, size_t size);

using NamedDigests = std::vector<std::pair<std::string, TensorDigest>>;

// Every parameter, and with `buffers` every buffer, by name.
NamedDigests model_digests(const Model& model, bool buffers);

// One digest over a list: its names and their hashes, in order.
std::string combined_hex(const NamedDigests& digests);

}  // namespace lockstep

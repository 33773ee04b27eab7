#pragma once
// Training and test data held in memory, decoded once: inputs (float32,
// any shape [N, ...]) and targets ([N, ...]: int64 classes with -1 for
// "missing", or float values with NaN for "missing"). Fashion-MNIST gives
// images [N, 1, 28, 28], normalised, and class labels; data.name = arrays
// takes any inputs and targets from numpy's .npy files.
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "runtime/config.h"

namespace lockstep {

struct Dataset {
  at::Tensor inputs;
  at::Tensor targets;
  int64_t size() const { return targets.size(0); }
};

struct TrainTestData {
  Dataset train;
  Dataset test;
  std::string description;  // for the log and the manifest
};

// Reads a gzip-compressed IDX file of unsigned bytes with `expected_dims`
// dimensions (3 for images, 1 for labels). Throws InputError naming the
// file for a missing, truncated or wrong file. Returns a uint8 tensor.
at::Tensor read_idx_gz(const std::string& path, int expected_dims);

// Fashion-MNIST from Debian's dataset-fashion-mnist layout in `dir`
// (train-images-idx3-ubyte.gz, ...). Checks that images and labels agree.
TrainTestData load_fashion_mnist(const std::string& dir);

// A learnable synthetic set (labels from a fixed random linear teacher),
// identical for a given seed on every machine. `missing_share` of the
// training labels are set to -1.
TrainTestData make_synthetic(int64_t train_samples, uint64_t seed, double missing_share);

// Cheap check, before anything starts: the files data.name needs exist.
// Throws InputError naming data.path and the missing file.
void check_data_files(const DataSection& data);

// Thorough check, for a launcher before it starts anything: every IDX file
// decompresses and has the size its header promises. Throws InputError.
void validate_data_files(const DataSection& data);

// Loads what data.name asks for. Throws InputError naming data.path.
TrainTestData load_data(const DataSection& data, uint64_t seed);

}  // namespace lockstep

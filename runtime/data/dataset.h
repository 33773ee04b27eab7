#pragma once
// Training and test data: inputs (any shape [N, ...], any dtype, possibly
// a memory-mapped file that is read only where rows are taken) and targets
// ([N, ...]: int64 classes with -1 for "missing", or float32 values with NaN
// for "missing"). Rows become float32 model inputs per batch (input_rows),
// so only the batches in flight are materialised. Fashion-MNIST gives
// images [N, 1, 28, 28], normalised, and class labels; data.name = arrays
// takes numpy's .npy and .npz files (data/arrays.h).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/config.h"

namespace lockstep {

// float32, times `scale`, then per channel (dimension 1) minus mean over std.
struct InputTransform {
  double scale = 1.0;
  std::vector<double> mean, std;  // empty, one value, or one per channel
  at::Tensor apply(const at::Tensor& rows) const;
};

class RowReader;
struct Dataset {
  at::Tensor inputs;  // for shapes and dtype; rows come through `reader` when it is set
  std::shared_ptr<const RowReader> reader;
  at::Tensor targets;
  InputTransform transform;
  at::Tensor row_map;  // defined: row i of this set is row row_map[i] of `inputs` (a split)
  int64_t size() const { return targets.size(0); }
  // Rows `rows` (int64 indices) as model inputs: gathered, then transformed.
  at::Tensor input_rows(const at::Tensor& rows) const;
};

struct TrainTestData {
  Dataset train;
  Dataset test;
  Dataset validation;             // empty (size 0) unless data.validation is set
  bool has_validation() const { return validation.targets.defined() && validation.size() > 0; }
  std::string description;  // for the log and the manifest
  std::vector<std::string> files;  // what it was read from, for provenance (data/provenance.h)
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

// Holds out data.validation: a fraction of `data.train` (a permutation
// seeded by `seed`, the same on every rank) or a set of its own read by
// `read` (arrays). Logged as a decision.
void split_validation(const DataSection& section, uint64_t seed, TrainTestData& data);

// Loads what data.name asks for. Throws InputError naming data.path.
TrainTestData load_data(const DataSection& data, uint64_t seed);

}  // namespace lockstep

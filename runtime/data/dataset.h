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

#include "runtime/job/config.h"

namespace lockstep {

// float32, times `scale`, then per channel (dimension 1) minus mean over std.
struct InputTransform {
  double scale = 1.0;
  std::vector<double> mean, std;  // empty, one value, or one per channel
  at::Tensor apply(const at::Tensor& rows) const;
};

// Where rows come from when they are not in memory: a memory-mapped array
// (data/npy.h) or image files decoded on demand (data/images.h). Safe to
// call from several threads at once.
class RowSource {
 public:
  virtual ~RowSource() = default;
  // Rows `rows` (int64 indices, in that order), stacked. A row that cannot
  // be read either throws InputError naming its file, or (where the user
  // chose to skip such files) comes back as zeros and, when `unreadable` is
  // given, its position in `rows` is appended there.
  virtual at::Tensor read(const at::Tensor& rows, std::vector<int64_t>* unreadable = nullptr) const = 0;
  // Rows skipped so far because they could not be read.
  virtual int64_t unreadable_count() const { return 0; }
  // How many threads may work on one read (decoding images); call before
  // reads start.
  virtual void set_threads(int /*threads*/) {}
};

struct Dataset {
  at::Tensor inputs;  // for shapes and dtype; rows come through `reader` when it is set
  std::shared_ptr<RowSource> reader;
  at::Tensor targets;
  InputTransform transform;
  at::Tensor row_map;  // defined: row i of this set is row row_map[i] of `inputs` (a split)
  int64_t size() const { return targets.size(0); }
  // Rows `rows` (int64 indices) as model inputs: gathered, then transformed.
  // Positions of rows that could not be read (and were skipped) go to `unreadable`.
  at::Tensor input_rows(const at::Tensor& rows, std::vector<int64_t>* unreadable = nullptr) const;
  // Targets of `rows`, with those at the `unreadable` positions marked missing.
  at::Tensor target_rows(const at::Tensor& rows, const std::vector<int64_t>& unreadable = {}) const;
};

struct TrainTestData {
  Dataset train;
  Dataset test;
  Dataset validation;             // empty (size 0) unless data.validation is set
  bool has_validation() const { return validation.targets.defined() && validation.size() > 0; }
  std::string description;  // for the log and the manifest
  std::vector<std::string> files;  // what it was read from, for provenance (data/provenance.h)
  // Image folders: each folder with its image files, for provenance.
  std::vector<std::pair<std::string, std::vector<std::string>>> folders;
  std::vector<std::string> classes;      // class names by index, where the data names them
  std::vector<std::string> bad_files;    // files skipped before training (data.bad_files = skip)
  // Rows skipped while batches were assembled on this rank (files that
  // passed the first check but do not decode; data.bad_files = skip).
  int64_t unreadable_in_batches() const;
  // Lets image decoding use `threads` threads per read.
  void set_reader_threads(int threads);
};

// Reads a gzip-compressed IDX file of unsigned bytes with `expected_dims`
// dimensions (3 for images, 1 for labels). Throws InputError naming the
// file for a missing, truncated or wrong file. Returns a uint8 tensor.
at::Tensor read_idx_gz(const std::string& path, int expected_dims);

// Fashion-MNIST from Debian's dataset-fashion-mnist layout in `dir`
// (train-images-idx3-ubyte.gz, ...). Checks that images and labels agree.
TrainTestData load_fashion_mnist(const std::string& dir);

// A learnable synthetic set (ten fixed random class prototypes under unit
// Gaussian noise), identical for a given seed on every machine. `missing_share` of the
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

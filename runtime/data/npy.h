#pragma once
// numpy's array files as tensors, without reading what is not used:
// a `.npy` file (versions 1-3) and the members of an `.npz` (numpy.savez,
// savez_compressed). Uncompressed data is not read: the file is mapped for
// its header and layout, and rows are read on demand (RowReader). A
// deflated `.npz` member is inflated into memory once. Little-endian (or single-byte)
// numbers and bool in C order; anything else (big-endian, Fortran order,
// objects, structured dtypes, a truncated file, a missing member) is an
// InputError naming the file, the array and what was found.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/data/dataset.h"

namespace lockstep {

// Rows of an array stored uncompressed in a file, read on demand with
// pread: only the rows asked for are materialised. (A memory map of the
// same file would do, but a kernel that keeps the page cache in large
// folios maps a whole folio per touched row: 2.2 GB resident after 300
// steps on a 2 GiB file, measured.) Thread-safe.
class RowReader : public RowSource {
 public:
  RowReader(const std::string& path, int64_t data_offset, std::vector<int64_t> shape,
            at::ScalarType dtype);
  ~RowReader() override;
  RowReader(const RowReader&) = delete;
  RowReader& operator=(const RowReader&) = delete;
  // Rows `rows` (int64 indices, in that order), the array's dtype. A short
  // read (the file changed under the run) throws.
  at::Tensor read(const at::Tensor& rows, std::vector<int64_t>* unreadable = nullptr) const override;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t data_offset_ = 0, row_bytes_ = 0;
  std::vector<int64_t> shape_;
  at::ScalarType dtype_;
};

struct LoadedArray {
  at::Tensor tensor;       // the array's dtype and shape (a view of the mapped file, or in memory)
  std::shared_ptr<RowReader> reader;  // set for uncompressed data: read rows through it
  bool mapped = false;     // false: read into memory (a deflated .npz member)
  int64_t bytes = 0;       // of array data
  std::string where;       // "x.npy in train.npz", for messages
};

// A `.npy` file.
LoadedArray load_npy(const std::string& path);

// Member `name` (without ".npy") of the `.npz` at `path`. Throws
// InputError listing the members there are when it is missing.
LoadedArray load_npz_member(const std::string& path, const std::string& name);

// The members of an `.npz` (without ".npy").
std::vector<std::string> npz_members(const std::string& path);

}  // namespace lockstep

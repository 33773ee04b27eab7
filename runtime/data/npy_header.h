#pragma once
// The header of a numpy `.npy` file (format 1.0, 2.0, 3.0), read as untrusted
// input: the dict literal numpy writes ({'descr': '<f4', 'fortran_order':
// False, 'shape': (256, 1, 28, 28), }) is parsed by one left-to-right pass
// with no recursion and no backtracking, the header is at most
// kMaxNpyHeaderBytes long (numpy's own reader refuses longer ones by
// default), every dimension is a non-negative number that fits in int64, and
// the element count times the element size is checked for overflow.
// Anything else is an InputError naming `where` and what was found.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lockstep {

constexpr size_t kMaxNpyHeaderBytes = 10000;

struct NpyHeader {
  std::string descr;            // e.g. "<f4"; not yet checked against the supported dtypes
  bool fortran_order = false;
  std::vector<int64_t> shape;   // at least one dimension, each >= 0
  size_t data_offset = 0;       // where the array data starts, from the file's first byte
};

// Reads the header at the start of `bytes` (`size` bytes available; more
// may follow). Needs only the magic, the version, the length and the header
// itself: a caller may pass the first kMaxNpyHeaderBytes + 12 bytes of a
// larger file.
NpyHeader parse_npy_header(const uint8_t* bytes, size_t size, const std::string& where);

// shape's element count times `element_size`, or an InputError naming
// `where` when the product does not fit in int64.
int64_t npy_data_bytes(const std::vector<int64_t>& shape, int64_t element_size, const std::string& where);

}  // namespace lockstep

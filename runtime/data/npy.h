#pragma once
// numpy's .npy format (versions 1-3), read whole into a tensor of the same
// dtype and shape. Little-endian (or single-byte) numbers and bool in C
// order; anything else (big-endian, Fortran order, objects, structured
// dtypes, a truncated file) is an InputError naming the file and what was
// found.
#include <string>

#include <ATen/core/Tensor.h>

namespace lockstep {

at::Tensor read_npy(const std::string& path);

// data.name = arrays: `folder`/x.npy (inputs, converted to float32) and
// `folder`/y.npy (targets: integers to int64 with -1 = missing, floats to
// float32 with NaN = missing). Throws InputError naming the file for a
// missing file or a row count that differs between x and y.
struct Dataset;
Dataset read_array_folder(const std::string& folder, const std::string& key);

}  // namespace lockstep

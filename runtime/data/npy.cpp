#include "runtime/data/npy.h"

#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <regex>

#include <torch/torch.h>

#include "runtime/data/dataset.h"
#include "runtime/errors.h"

namespace lockstep {
namespace {

constexpr int64_t kMaxNpyBytes = int64_t(16) << 30;  // in memory; larger needs a memory-mapped source

at::ScalarType dtype_of(const std::string& path, const std::string& descr) {
  static const std::map<std::string, at::ScalarType> known = {
      {"f2", at::kHalf}, {"f4", at::kFloat}, {"f8", at::kDouble}, {"i1", at::kChar},
      {"i2", at::kShort}, {"i4", at::kInt},  {"i8", at::kLong},   {"u1", at::kByte},
      {"b1", at::kBool}};
  const std::string allowed = "float16/32/64, int8/16/32/64, uint8, bool; little-endian";
  if (descr.size() != 3 || (descr[0] != '<' && descr[0] != '|'))
    throw InputError(path + ": dtype '" + descr + "' is not supported (" +
                     (descr.size() == 3 && descr[0] == '>' ? "big-endian; convert with "
                                                             "a.astype(a.dtype.newbyteorder('<'))"
                                                           : "allowed: " + allowed) + ")");
  auto it = known.find(descr.substr(1));
  if (it == known.end())
    throw InputError(path + ": dtype '" + descr + "' is not supported (allowed: " + allowed + ")");
  return it->second;
}

}  // namespace

at::Tensor read_npy(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) throw InputError(path + ": no such file");
  if (!S_ISREG(info.st_mode)) throw InputError(path + ": not a regular file");
  if (info.st_size > kMaxNpyBytes)
    throw InputError(path + ": " + std::to_string(info.st_size >> 20) + " MiB is more than the " +
                     std::to_string(kMaxNpyBytes >> 20) + " MiB read into memory");
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  if (in.gcount() != 8 || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw InputError(path + ": not a .npy file (no \\x93NUMPY magic); write it with numpy.save");
  const int major = static_cast<unsigned char>(magic[6]);
  if (major < 1 || major > 3)
    throw InputError(path + ": .npy version " + std::to_string(major) + " (allowed: 1, 2, 3)");
  uint32_t header_length = 0;
  unsigned char length_bytes[4] = {};
  in.read(reinterpret_cast<char*>(length_bytes), major == 1 ? 2 : 4);
  for (int i = (major == 1 ? 1 : 3); i >= 0; --i) header_length = (header_length << 8) | length_bytes[i];
  if (!in || header_length > (1u << 20)) throw InputError(path + ": truncated or damaged .npy header");
  std::string header(header_length, '\0');
  in.read(header.data(), header_length);
  if (in.gcount() != std::streamsize(header_length)) throw InputError(path + ": truncated .npy header");

  std::smatch match;
  if (!std::regex_search(header, match, std::regex("'descr'\\s*:\\s*'([^']*)'")))
    throw InputError(path + ": .npy header has no simple 'descr' (structured or object dtypes are "
                     "not supported): " + header.substr(0, 120));
  const at::ScalarType dtype = dtype_of(path, match[1]);
  if (!std::regex_search(header, match, std::regex("'fortran_order'\\s*:\\s*(True|False)")))
    throw InputError(path + ": .npy header has no 'fortran_order'");
  if (match[1] == "True")
    throw InputError(path + ": the array is in Fortran order; save numpy.ascontiguousarray(a)");
  if (!std::regex_search(header, match, std::regex("'shape'\\s*:\\s*\\(([^)]*)\\)")))
    throw InputError(path + ": .npy header has no 'shape'");
  std::vector<int64_t> shape;
  const std::string dims = match[1];
  const std::regex number("[0-9]+");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it)
    shape.push_back(std::stoll(it->str()));
  if (shape.empty()) throw InputError(path + ": a 0-dimensional array; one row per sample is needed");

  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  const int64_t bytes = count * int64_t(c10::elementSize(dtype));
  const int64_t data_start = int64_t(in.tellg());
  if (data_start + bytes != int64_t(info.st_size))
    throw InputError(path + ": the header promises " + std::to_string(bytes) + " bytes of data " +
                     c10::str(c10::IntArrayRef(shape)) + ", the file holds " +
                     std::to_string(int64_t(info.st_size) - data_start) + " (truncated or damaged)");
  at::Tensor tensor = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  in.read(static_cast<char*>(tensor.data_ptr()), bytes);
  if (in.gcount() != bytes) throw InputError(path + ": truncated while reading");
  return tensor;
}

Dataset read_array_folder(const std::string& folder, const std::string& key) {
  struct stat info {};
  if (::stat(folder.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
    throw InputError(key + " = " + folder + ": no such folder (a folder holding x.npy and y.npy)");
  const std::string x_path = folder + "/x.npy", y_path = folder + "/y.npy";
  at::Tensor x = read_npy(x_path), y = read_npy(y_path);
  if (x.size(0) != y.size(0))
    throw InputError(key + " = " + folder + ": x.npy has " + std::to_string(x.size(0)) +
                     " rows but y.npy has " + std::to_string(y.size(0)) + "; one target row per input row");
  if (x.size(0) == 0) throw InputError(key + " = " + folder + ": x.npy has no rows");
  Dataset set;
  set.inputs = x.to(at::kFloat).contiguous();
  set.targets = y.is_floating_point() ? y.to(at::kFloat) : y.to(at::kLong);
  return set;
}

}  // namespace lockstep

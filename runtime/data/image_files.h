#pragma once
// One image file, read as untrusted input: its header and end checked
// without decoding it (what it is, its size and colour, whether it is whole,
// and whether it is small enough to decode: PIL's pixel limit), and its
// pixels decoded by libpng or libjpeg. Used by the image folders
// (runtime/data/images.h), which list, label and batch the files.
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <ATen/core/Tensor.h>

namespace lockstep {

enum class Format { kUnknown, kPng, kJpeg };

struct ImageHeader {
  Format format = Format::kUnknown;
  int64_t width = 0, height = 0;  // 0: not found in the first bytes (the decoder finds them)
  bool colour = false;
};

// .png, .jpg or .jpeg, in any case.
bool is_image_name(const std::filesystem::path& path);

// The whole file; InputError naming it when it cannot be opened.
std::string read_whole(const std::string& path);

// The header and the end of one file: what it is, its size and colour, and
// whether it is whole and within the pixel limit. Returns "" when it looks
// whole, else what is wrong (for a message naming the file).
std::string check_image_file(const std::string& path, ImageHeader* header);

// Whether `bytes` begin with PNG's signature (else they are taken for a JPEG).
bool starts_as_png(const std::string& bytes);

// Thrown by the decoders; turned into InputError or a skipped row.
struct DecodeFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// [channels, height, width] uint8. Grey from colour as PIL's convert("L").
at::Tensor decode_png(const std::string& bytes, int channels);

// [channels, height, width] uint8; grey is libjpeg's luminance.
at::Tensor decode_jpeg(const std::string& bytes, int channels);

}  // namespace lockstep

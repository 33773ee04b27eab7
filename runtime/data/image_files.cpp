#include "runtime/data/image_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include <jpeglib.h>
#include <png.h>
#include <spdlog/fmt/fmt.h>
#include <torch/torch.h>

#include "runtime/base/errors.h"

namespace lockstep {
namespace {

std::string lower(std::string text) {
  for (auto& c : text) c = char(std::tolower(static_cast<unsigned char>(c)));
  return text;
}
// Reads up to `count` bytes at `offset`; fewer at the end of the file.
std::string read_at(int fd, int64_t offset, size_t count) {
  std::string out(count, '\0');
  size_t done = 0;
  while (done < count) {
    const ssize_t got = ::pread(fd, &out[done], count - done, offset + int64_t(done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += size_t(got);
  }
  out.resize(done);
  return out;
}
uint32_t be32(const std::string& b, size_t at) {
  return uint32_t(uint8_t(b[at])) << 24 | uint32_t(uint8_t(b[at + 1])) << 16 |
         uint32_t(uint8_t(b[at + 2])) << 8 | uint32_t(uint8_t(b[at + 3]));
}

uint32_t be16(const std::string& b, size_t at) { return uint32_t(uint8_t(b[at])) << 8 | uint8_t(b[at + 1]); }

// As PIL's Image.MAX_IMAGE_PIXELS: a larger image is taken for a
// decompression bomb (a few MB of PNG that decodes to gigabytes).
constexpr int64_t kMaxImagePixels = 89478485;

std::string too_many_pixels(const ImageHeader& header) {
  if (header.width * header.height <= kMaxImagePixels) return "";
  return fmt::format("{} x {} pixels, more than the {} allowed (a decompression bomb?); resize it first",
                     header.width, header.height, kMaxImagePixels);
}

const std::string kPngSignature("\x89PNG\r\n\x1a\n", 8);
const std::string kPngEnd("\0\0\0\0IEND\xae\x42\x60\x82", 12);
struct JpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_fail(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  (*info->err->format_message)(info, errors->message);
  std::longjmp(errors->jump, 1);
}

void jpeg_quiet(j_common_ptr, int) {}  // warnings (extra bytes, ...) are not failures

struct JpegPixels {
  std::vector<uint8_t> bytes;  // height x width x components
  int64_t height = 0, width = 0, components = 0;
  std::string error;
};

// libjpeg reports errors by longjmp: this frame holds no C++ object whose
// destructor the jump could skip, only `info` and `errors`, used through
// their addresses as libjpeg's own example does.
bool decode_jpeg_into(const std::string& bytes, int channels, JpegPixels* out) {
  jpeg_decompress_struct info{};
  JpegErrors errors{};
  info.err = jpeg_std_error(&errors.manager);
  errors.manager.error_exit = jpeg_fail;
  errors.manager.emit_message = jpeg_quiet;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&info);
    out->error = std::string("JPEG: ") + errors.message;
    return false;
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  if (info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&info);
    out->error = "JPEG: CMYK colour, which is not converted (save it as RGB)";
    return false;
  }
  info.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&info);
  out->height = info.output_height;
  out->width = info.output_width;
  out->components = info.output_components;
  out->bytes.resize(size_t(out->height * out->width * out->components));
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = out->bytes.data() + int64_t(info.output_scanline) * out->width * out->components;
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  return true;
}

}  // namespace

bool starts_as_png(const std::string& bytes) { return bytes.compare(0, 8, kPngSignature) == 0; }

bool is_image_name(const std::filesystem::path& path) {
  const std::string ext = lower(path.extension().string());
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

std::string read_whole(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat info {};
  ::fstat(fd, &info);
  std::string bytes = read_at(fd, 0, size_t(info.st_size));
  ::close(fd);
  return bytes;
}

// The header and the end of one file: what it is, its size and colour, and
// whether it is whole. Returns "" when it looks whole, else what is wrong.
std::string check_image_file(const std::string& path, ImageHeader* header) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::string("cannot open (") + std::strerror(errno) + ")";
  struct stat info {};
  ::fstat(fd, &info);
  const int64_t size = info.st_size;
  const std::string head = read_at(fd, 0, size_t(std::min<int64_t>(size, 64 << 10)));
  const std::string tail = read_at(fd, std::max<int64_t>(0, size - 1024), size_t(std::min<int64_t>(size, 1024)));
  ::close(fd);
  if (size == 0) return "empty file";
  if (head.compare(0, 8, kPngSignature) == 0) {
    header->format = Format::kPng;
    if (head.size() < 33 || head.compare(12, 4, "IHDR") != 0) return "PNG without its IHDR header (truncated)";
    header->width = be32(head, 16);
    header->height = be32(head, 20);
    header->colour = (uint8_t(head[25]) & 2) != 0;
    if (tail.size() < 12 || tail.compare(tail.size() - 12, 12, kPngEnd) != 0)
      return "PNG without its IEND chunk at the end (truncated, or bytes appended)";
    return too_many_pixels(*header);
  }
  if (head.size() >= 3 && uint8_t(head[0]) == 0xFF && uint8_t(head[1]) == 0xD8 && uint8_t(head[2]) == 0xFF) {
    header->format = Format::kJpeg;
    // Markers up to the frame header (SOFn) give the size and components.
    size_t at = 2;
    while (at + 9 < head.size() && uint8_t(head[at]) == 0xFF) {
      const uint8_t marker = uint8_t(head[at + 1]);
      const bool frame = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
      if (frame) {
        header->height = be16(head, at + 5);
        header->width = be16(head, at + 7);
        header->colour = uint8_t(head[at + 9]) >= 3;
        break;
      }
      at += 2 + be16(head, at + 2);
    }
    // Entropy-coded data never holds FF D9, so its absence near the end
    // means the file was cut short.
    bool ended = false;
    for (size_t i = 0; i + 1 < tail.size(); ++i)
      if (uint8_t(tail[i]) == 0xFF && uint8_t(tail[i + 1]) == 0xD9) ended = true;
    if (!ended) return "JPEG without its end marker (truncated)";
    return too_many_pixels(*header);
  }
  std::string start;
  for (size_t i = 0; i < std::min<size_t>(head.size(), 8); ++i) start += fmt::format("{:02x}", uint8_t(head[i]));
  return "neither PNG nor JPEG (starts with bytes " + start + ")";
}

// [channels, height, width] uint8. Grey from colour as PIL's convert("L").
at::Tensor decode_png(const std::string& bytes, int channels) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()))
    throw DecodeFailure(std::string("PNG: ") + image.message);
  const bool colour_in = (image.format & PNG_FORMAT_FLAG_COLOR) != 0;
  const bool read_rgb = channels == 3 || colour_in;
  image.format = read_rgb ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  const int64_t h = image.height, w = image.width, stored = read_rgb ? 3 : 1;
  at::Tensor pixels = torch::empty({h, w, stored}, torch::kUInt8);
  if (!png_image_finish_read(&image, nullptr, pixels.data_ptr<uint8_t>(), 0, nullptr)) {
    const std::string message = image.message;
    png_image_free(&image);
    throw DecodeFailure("PNG: " + message);
  }
  if (channels == 1 && read_rgb) {
    auto rgb = pixels.to(torch::kInt32);
    auto grey = (rgb.select(2, 0) * 19595 + rgb.select(2, 1) * 38470 + rgb.select(2, 2) * 7471 + 0x8000)
                    .div(65536, "floor");
    return grey.to(torch::kUInt8).unsqueeze(0);
  }
  return pixels.permute({2, 0, 1}).contiguous();
}

// [channels, height, width] uint8; grey is libjpeg's luminance.
at::Tensor decode_jpeg(const std::string& bytes, int channels) {
  JpegPixels pixels;
  if (!decode_jpeg_into(bytes, channels, &pixels)) throw DecodeFailure(pixels.error);
  // clone: from_blob only borrows the vector, and contiguous() of a
  // one-channel view is the view itself.
  return torch::from_blob(pixels.bytes.data(), {pixels.height, pixels.width, pixels.components}, torch::kUInt8)
      .permute({2, 0, 1})
      .clone(at::MemoryFormat::Contiguous);
}

}  // namespace lockstep

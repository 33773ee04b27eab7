#include "runtime/data/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <map>
#include <memory>

#include <torch/torch.h>

#include "runtime/data/npy_header.h"
#include "runtime/base/errors.h"

namespace lockstep {
namespace {

// A read-only mapping of a whole file, alive while any tensor views it.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) throw InputError(path + ": no such file");
    if (!S_ISREG(info.st_mode)) throw InputError(path + ": not a regular file");
    size_ = size_t(info.st_size);
    if (size_ == 0) throw InputError(path + ": an empty file");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw InputError(path + ": cannot open (" + std::strerror(errno) + ")");
    void* address = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (address == MAP_FAILED) throw InputError(path + ": cannot map (" + std::strerror(errno) + ")");
    // Only headers are read through the mapping (rows go through RowReader):
    // no read-ahead around them.
    ::madvise(address, size_, MADV_RANDOM);
    data_ = static_cast<const uint8_t*>(address);
  }
  ~MappedFile() { ::munmap(const_cast<uint8_t*>(data_), size_); }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

at::ScalarType dtype_of(const std::string& where, const std::string& descr) {
  static const std::map<std::string, at::ScalarType> known = {
      {"f2", at::kHalf}, {"f4", at::kFloat}, {"f8", at::kDouble}, {"i1", at::kChar},
      {"i2", at::kShort}, {"i4", at::kInt},  {"i8", at::kLong},   {"u1", at::kByte},
      {"b1", at::kBool}};
  const std::string allowed = "float16/32/64, int8/16/32/64, uint8, bool; little-endian";
  const bool big_endian = descr.size() == 3 && descr[0] == '>' && descr.substr(1) != "u1" &&
                          descr.substr(1) != "i1" && descr.substr(1) != "b1";
  if (big_endian)
    throw InputError(where + ": dtype '" + descr + "' is big-endian; save "
                     "a.astype(a.dtype.newbyteorder('<')) instead");
  if (descr.size() > 16)
    throw InputError(where + ": dtype of " + std::to_string(descr.size()) + " characters is not supported (allowed: " +
                     allowed + ")");
  if (descr.size() != 3 || (descr[0] != '<' && descr[0] != '|' && descr[0] != '>') ||
      !known.count(descr.substr(1)))
    throw InputError(where + ": dtype '" + descr + "' is not supported (allowed: " + allowed + ")");
  return known.at(descr.substr(1));
}

struct NpyLayout {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  size_t data_offset = 0;
  int64_t data_bytes = 0;
};

// Parses the header at `bytes` (a whole .npy of `size` bytes) and checks
// that the file holds exactly the bytes it promises.
NpyLayout parse_npy(const uint8_t* bytes, size_t size, const std::string& where) {
  const NpyHeader header = parse_npy_header(bytes, size, where);
  NpyLayout layout;
  layout.dtype = dtype_of(where, header.descr);
  if (header.fortran_order)
    throw InputError(where + ": the array is in Fortran order; save numpy.ascontiguousarray(a)");
  layout.shape = header.shape;
  layout.data_offset = header.data_offset;
  layout.data_bytes = npy_data_bytes(layout.shape, int64_t(c10::elementSize(layout.dtype)), where);
  const int64_t held = int64_t(size) - int64_t(layout.data_offset);
  if (held != layout.data_bytes)
    throw InputError(where + ": the header promises " + std::to_string(layout.data_bytes) +
                     " bytes for " + std::string(c10::toString(layout.dtype)) + " " +
                     c10::str(c10::IntArrayRef(layout.shape)) + ", the file holds " +
                     std::to_string(held) + (held < layout.data_bytes ? " (truncated)" : " (damaged)"));
  return layout;
}

LoadedArray view_npy(const uint8_t* bytes, size_t size, std::shared_ptr<void> keep_alive,
                     const std::string& where, const std::string& file = "", int64_t file_offset = -1) {
  const bool mapped = file_offset >= 0;
  NpyLayout layout = parse_npy(bytes, size, where);
  LoadedArray out;
  if (mapped)
    out.reader = std::make_shared<RowReader>(file, file_offset + int64_t(layout.data_offset),
                                             layout.shape, layout.dtype);
  out.where = where;
  out.mapped = mapped;
  out.bytes = layout.data_bytes;
  // The tensor views the bytes in place; `keep_alive` (the mapping or the
  // inflated buffer) lives as long as it does. Nothing writes to it.
  out.tensor = torch::from_blob(const_cast<uint8_t*>(bytes + layout.data_offset), layout.shape,
                                [keep_alive](void*) {}, torch::TensorOptions().dtype(layout.dtype));
  return out;
}

uint32_t u16(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8; }
uint32_t u32(const uint8_t* p) { return u16(p) | u16(p + 2) << 16; }
uint64_t u64(const uint8_t* p) { return uint64_t(u32(p)) | uint64_t(u32(p + 4)) << 32; }

// Whether the `length` bytes from `offset` lie inside a file of `size` bytes.
// Written so that no sum can wrap, whatever a hostile file claims.
bool within(uint64_t offset, uint64_t length, size_t size) {
  return offset <= size && length <= size - offset;
}

struct ZipMember {
  std::string name;
  uint32_t method = 0;
  uint64_t compressed = 0, uncompressed = 0, local_header = 0;
};

// The central directory of a zip (zip64 included), as numpy writes it.
// Every offset and length read from the file is checked against its size
// before it is used.
std::vector<ZipMember> zip_members(const MappedFile& file, const std::string& path) {
  const uint8_t* data = file.data();
  const size_t size = file.size();
  auto bad = [&](const std::string& why) { return InputError(path + ": not a readable .npz (" + why + ")"); };
  if (size < 22) throw bad("too short for a zip file");
  size_t end = size - 22;
  const size_t lowest = size > 22 + 65535 ? size - 22 - 65535 : 0;
  while (u32(data + end) != 0x06054b50) {
    if (end == lowest) throw bad("no end of central directory: truncated?");
    --end;
  }
  uint64_t entries = u16(data + end + 10), directory = u32(data + end + 16);
  if ((entries == 0xffff || directory == 0xffffffff) && end >= 20 && u32(data + end - 20) == 0x07064b50) {
    const uint64_t record = u64(data + end - 20 + 8);
    if (!within(record, 56, size) || u32(data + record) != 0x06064b50) throw bad("damaged zip64 record");
    entries = u64(data + record + 32);
    directory = u64(data + record + 48);
  }
  // Each entry takes at least 46 bytes: a count past that is a lie.
  if (entries > size / 46) throw bad("the directory claims " + std::to_string(entries) + " members");
  std::vector<ZipMember> members;
  uint64_t at = directory;
  for (uint64_t i = 0; i < entries; ++i) {
    if (!within(at, 46, size) || u32(data + at) != 0x02014b50) throw bad("damaged central directory");
    ZipMember m;
    m.method = u16(data + at + 10);
    m.compressed = u32(data + at + 20);
    m.uncompressed = u32(data + at + 24);
    const uint64_t name_length = u16(data + at + 28), extra_length = u16(data + at + 30),
                   comment_length = u16(data + at + 32);
    m.local_header = u32(data + at + 42);
    if (!within(at + 46, name_length + extra_length + comment_length, size)) throw bad("damaged central directory");
    m.name.assign(reinterpret_cast<const char*>(data + at + 46), name_length);
    // zip64: the 64-bit values of the fields that hold 0xffffffff, in order.
    const uint64_t extra_end = at + 46 + name_length + extra_length;
    for (uint64_t x = at + 46 + name_length; extra_end - x >= 4;) {
      const uint64_t id = u16(data + x), length = u16(data + x + 2);
      if (length > extra_end - x - 4) throw bad("damaged extra field of " + m.name);
      if (id == 0x0001) {
        uint64_t field = x + 4;
        const uint64_t field_end = field + length;
        auto next = [&]() {
          if (field_end - field < 8) throw bad("damaged zip64 field of " + m.name);
          const uint64_t value = u64(data + field);
          field += 8;
          return value;
        };
        if (m.uncompressed == 0xffffffff) m.uncompressed = next();
        if (m.compressed == 0xffffffff) m.compressed = next();
        if (m.local_header == 0xffffffff) m.local_header = next();
      }
      x += 4 + length;
    }
    members.push_back(m);
    at += 46 + name_length + extra_length + comment_length;
  }
  return members;
}

// Inflates a deflated member that claims `claimed` bytes. The claim is
// never allocated on trust: it must be one deflate can produce from the
// compressed size, the member's own .npy header (inflated first) must
// promise the same, and the buffer grows as data arrives.
std::shared_ptr<std::vector<uint8_t>> inflate_member(const uint8_t* input, uint64_t compressed, uint64_t claimed,
                                                     const std::string& where) {
  // Deflate's largest expansion is 1032:1 (258 bytes from 2 bits).
  constexpr uint64_t kMaxRatio = 1032;
  if (claimed / kMaxRatio > compressed + 64)
    throw InputError(where + ": the zip directory claims " + std::to_string(claimed) + " bytes from " +
                     std::to_string(compressed) + " deflated bytes, more than deflate can produce (damaged)");
  z_stream stream{};
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) throw InputError(where + ": cannot start zlib");
  struct End {
    z_stream* s;
    ~End() { inflateEnd(s); }
  } end{&stream};
  auto out = std::make_shared<std::vector<uint8_t>>();
  // zlib counts in 32 bits: feed and drain it in slices of at most 1 GiB.
  constexpr uint64_t kSlice = uint64_t(1) << 30;
  uint64_t in_left = compressed;
  stream.next_in = const_cast<uint8_t*>(input);
  // First only the .npy header: its promise is checked before the rest.
  uint64_t limit = std::min<uint64_t>(claimed, kMaxNpyHeaderBytes + 12);
  bool header_checked = false;
  int status = Z_OK;
  while (true) {
    if (out->size() == limit) {
      if (!header_checked) {
        const NpyHeader header = parse_npy_header(out->data(), out->size(), where);
        const int64_t element = int64_t(c10::elementSize(dtype_of(where, header.descr)));
        const uint64_t promised = header.data_offset + uint64_t(npy_data_bytes(header.shape, element, where));
        if (promised != claimed)
          throw InputError(where + ": the zip directory claims " + std::to_string(claimed) +
                           " bytes, its .npy header promises " + std::to_string(promised) + " (damaged)");
        header_checked = true;
      }
      if (out->size() == claimed) break;
      // Grow by doubling, from 64 MiB, never past the checked claim.
      limit = std::min<uint64_t>(claimed, std::max<uint64_t>(out->size() * 2, uint64_t(64) << 20));
    }
    if (status == Z_STREAM_END) break;
    const size_t used = out->size();
    out->resize(size_t(std::min<uint64_t>(limit, used + kSlice)));
    stream.next_out = out->data() + used;
    stream.avail_out = uInt(out->size() - used);
    if (stream.avail_in == 0 && in_left > 0) {
      stream.avail_in = uInt(std::min(in_left, kSlice));
      in_left -= stream.avail_in;
    }
    status = inflate(&stream, Z_NO_FLUSH);
    out->resize(used + (out->size() - used - stream.avail_out));
    if (status == Z_BUF_ERROR && stream.avail_in == 0 && in_left == 0) break;  // input ran out
    if (status != Z_OK && status != Z_STREAM_END && status != Z_BUF_ERROR) break;
  }
  if (status != Z_STREAM_END || out->size() != claimed)
    throw InputError(where + ": the deflated member does not inflate to its " + std::to_string(claimed) +
                     " bytes (damaged or truncated)");
  return out;
}

}  // namespace

RowReader::RowReader(const std::string& path, int64_t data_offset, std::vector<int64_t> shape,
                     at::ScalarType dtype)
    : path_(path), data_offset_(data_offset), shape_(std::move(shape)), dtype_(dtype) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw InputError(path + ": cannot open (" + std::strerror(errno) + ")");
  row_bytes_ = int64_t(c10::elementSize(dtype));
  for (size_t d = 1; d < shape_.size(); ++d) row_bytes_ *= shape_[d];
}

RowReader::~RowReader() {
  if (fd_ >= 0) ::close(fd_);
}

at::Tensor RowReader::read(const at::Tensor& rows, std::vector<int64_t>*) const {
  std::vector<int64_t> shape = shape_;
  shape[0] = rows.numel();
  at::Tensor out = torch::empty(shape, torch::TensorOptions().dtype(dtype_));
  auto* dst = static_cast<char*>(out.data_ptr());
  const at::Tensor indices = rows.to(at::kLong).contiguous();
  const int64_t* index = indices.data_ptr<int64_t>();
  for (int64_t i = 0; i < indices.numel(); ++i) {
    if (index[i] < 0 || index[i] >= shape_[0])
      throw RunError(path_ + ": row " + std::to_string(index[i]) + " of " + std::to_string(shape_[0]));
    for (int64_t done = 0; done < row_bytes_;) {
      const ssize_t got = ::pread(fd_, dst + i * row_bytes_ + done, size_t(row_bytes_ - done),
                                  off_t(data_offset_ + index[i] * row_bytes_ + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw RunError(path_ + ": reading row " + std::to_string(index[i]) + " failed (" +
                       (got == 0 ? std::string("the file shrank") : std::string(std::strerror(errno))) + ")");
      done += got;
    }
  }
  return out;
}

LoadedArray load_npy(const std::string& path) {
  auto file = std::make_shared<MappedFile>(path);
  return view_npy(file->data(), file->size(), file, path, path, 0);
}

std::vector<std::string> npz_members(const std::string& path) {
  MappedFile file(path);
  std::vector<std::string> names;
  for (const auto& m : zip_members(file, path))
    names.push_back(m.name.size() > 4 && m.name.substr(m.name.size() - 4) == ".npy"
                        ? m.name.substr(0, m.name.size() - 4) : m.name);
  return names;
}

LoadedArray load_npz_member(const std::string& path, const std::string& name) {
  auto file = std::make_shared<MappedFile>(path);
  const std::vector<ZipMember> members = zip_members(*file, path);
  const std::string where = name + ".npy in " + path;
  const ZipMember* found = nullptr;
  std::string names;
  for (const auto& m : members) {
    if (m.name == name + ".npy") found = &m;
    names += (names.empty() ? "" : ", ") + m.name.substr(0, m.name.size() >= 4 ? m.name.size() - 4 : 0);
  }
  if (!found)
    throw InputError(path + " has no array '" + name + "' (it holds: " + (names.empty() ? "nothing" : names) +
                     "); name the arrays with data.inputs_key / data.targets_key");
  const uint8_t* data = file->data();
  const uint64_t local = found->local_header;
  if (!within(local, 30, file->size()) || u32(data + local) != 0x04034b50)
    throw InputError(where + ": damaged local header (truncated?)");
  const uint64_t start = local + 30 + u16(data + local + 26) + u16(data + local + 28);
  if (!within(start, found->compressed, file->size()))
    throw InputError(where + ": the member runs past the end of the file (truncated)");
  if (found->method == 0)
    return view_npy(data + start, size_t(found->compressed), file, where, path, int64_t(start));
  if (found->method != 8)
    throw InputError(where + ": compression method " + std::to_string(found->method) +
                     " (allowed: stored, deflated: what numpy.savez and savez_compressed write)");
  auto inflated = inflate_member(data + start, found->compressed, found->uncompressed, where);
  return view_npy(inflated->data(), inflated->size(), inflated, where);
}

}  // namespace lockstep

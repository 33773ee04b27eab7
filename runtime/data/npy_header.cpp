#include "runtime/data/npy_header.h"

#include <cstring>
#include <limits>

#include "runtime/base/errors.h"
#include "runtime/base/printable.h"

namespace lockstep {
namespace {

// One pass over the dict literal. Every method advances `at` or throws.
class HeaderReader {
 public:
  HeaderReader(const char* text, size_t length, const std::string& where)
      : text_(text), length_(length), where_(where) {}

  NpyHeader read() {
    NpyHeader header;
    bool has_descr = false, has_order = false, has_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = quoted("a key");
      expect(':');
      skip_space();
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"')
          fail("has no simple 'descr' (structured or object dtypes are not supported)");
        header.descr = quoted("'descr'");
        has_descr = true;
      } else if (key == "fortran_order") {
        header.fortran_order = boolean();
        has_order = true;
      } else if (key == "shape") {
        header.shape = tuple();
        has_shape = true;
      } else {
        fail("has an unknown key '" + printable(key, 60) + "' (numpy writes descr, fortran_order, shape)");
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      skip_space();
      if (peek() != '}') fail("is not a dict literal (expected ',' or '}' at byte " + std::to_string(at_) + ")");
    }
    if (!has_descr) fail("has no 'descr'");
    if (!has_order) fail("has no 'fortran_order'");
    if (!has_shape) fail("has no 'shape'");
    if (header.shape.empty()) fail("describes a 0-dimensional array; one row per sample is needed");
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw InputError(where_ + ": the .npy header " + why + ": " + printable(std::string_view(text_, length_), 60) +
                     "; write the file with numpy.save");
  }
  char peek() const { return at_ < length_ ? text_[at_] : '\0'; }
  void skip_space() {
    while (at_ < length_ && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r'))
      ++at_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("is not a dict literal (expected '") + c + "' at byte " + std::to_string(at_) + ")");
    ++at_;
  }
  std::string quoted(const char* what) {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail(std::string("has no quoted string for ") + what + " at byte " + std::to_string(at_));
    const size_t start = ++at_;
    const void* end = std::memchr(text_ + start, quote, length_ - start);
    if (!end) fail(std::string("has an unterminated string for ") + what);
    at_ = size_t(static_cast<const char*>(end) - text_);
    std::string value(text_ + start, at_ - start);
    ++at_;
    return value;
  }
  bool boolean() {
    if (length_ - at_ >= 4 && std::memcmp(text_ + at_, "True", 4) == 0) return at_ += 4, true;
    if (length_ - at_ >= 5 && std::memcmp(text_ + at_, "False", 5) == 0) return at_ += 5, false;
    fail("has a 'fortran_order' that is neither True nor False");
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(');
    while (true) {
      skip_space();
      if (peek() == ')') break;
      if (peek() == '-') fail("has a negative dimension in 'shape'");
      if (peek() < '0' || peek() > '9') fail("has a 'shape' that is not a tuple of whole numbers");
      int64_t value = 0;
      while (peek() >= '0' && peek() <= '9') {
        const int digit = peek() - '0';
        if (value > (std::numeric_limits<int64_t>::max() - digit) / 10)
          fail("has a dimension in 'shape' that does not fit in 64 bits");
        value = value * 10 + digit;
        ++at_;
      }
      if (peek() == 'L') ++at_;  // Python 2's long suffix, which old numpy wrote
      if (dims.size() == 64) fail("has more than 64 dimensions in 'shape'");
      dims.push_back(value);
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      skip_space();
      if (peek() != ')') fail("has a 'shape' that is not a tuple of whole numbers");
    }
    ++at_;
    return dims;
  }

  const char* text_;
  size_t length_;
  const std::string& where_;
  size_t at_ = 0;
};

}  // namespace

NpyHeader parse_npy_header(const uint8_t* bytes, size_t size, const std::string& where) {
  if (size < 10 || std::memcmp(bytes, "\x93NUMPY", 6) != 0)
    throw InputError(where + ": not a .npy array (no \\x93NUMPY magic); write it with numpy.save");
  const int major = bytes[6];
  if (major < 1 || major > 3)
    throw InputError(where + ": .npy version " + std::to_string(major) + " (allowed: 1, 2, 3)");
  const size_t start = major == 1 ? 10 : 12;
  if (size < start) throw InputError(where + ": truncated .npy header");
  const size_t header_length =
      major == 1 ? size_t(bytes[8]) | size_t(bytes[9]) << 8
                 : size_t(bytes[8]) | size_t(bytes[9]) << 8 | size_t(bytes[10]) << 16 | size_t(bytes[11]) << 24;
  if (header_length > kMaxNpyHeaderBytes)
    throw InputError(where + ": the .npy header is " + std::to_string(header_length) + " bytes (at most " +
                     std::to_string(kMaxNpyHeaderBytes) + ", as numpy's own reader allows by default)");
  if (header_length > size - start) throw InputError(where + ": truncated .npy header");
  HeaderReader reader(reinterpret_cast<const char*>(bytes + start), header_length, where);
  NpyHeader header = reader.read();
  header.data_offset = start + header_length;
  return header;
}

int64_t npy_data_bytes(const std::vector<int64_t>& shape, int64_t element_size, const std::string& where) {
  int64_t total = element_size;
  for (int64_t d : shape) {
    if (d != 0 && total > std::numeric_limits<int64_t>::max() / d) {
      std::string dims;
      for (int64_t e : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(e);
      throw InputError(where + ": the .npy shape (" + dims + ") holds more bytes than fit in 64 bits");
    }
    total *= d;
  }
  return total;
}

}  // namespace lockstep

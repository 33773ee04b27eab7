#pragma once
// Untrusted text (a file's header, a folder's name) as it may go into a
// message: bytes outside printable ASCII written as \xNN, at most
// `max_bytes` of it followed by "..." — so a hostile input can neither
// flood the log nor write control characters to a terminal.
#include <cstddef>
#include <string>
#include <string_view>

namespace lockstep {

inline std::string printable(std::string_view text, size_t max_bytes = std::string_view::npos) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < text.size() && i < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (text.size() > max_bytes) out += "...";
  return out;
}

}  // namespace lockstep

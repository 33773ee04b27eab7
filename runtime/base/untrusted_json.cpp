#include "runtime/base/untrusted_json.h"

#include <iterator>

namespace lockstep {

nlohmann::json parse_untrusted_json(std::string_view text, std::string* why, JsonLimits limits) {
  auto refuse = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return nlohmann::json(nlohmann::json::value_t::discarded);
  };
  if (text.size() > limits.max_bytes)
    return refuse("larger than " + std::to_string(limits.max_bytes) + " bytes");
  // Depth outside strings, before the parser (and every later recursive
  // walk, dump() among them) sees the text.
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > limits.max_depth)
        return refuse("nested deeper than " + std::to_string(limits.max_depth) + " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    return refuse(std::string("not valid JSON (") + e.what() + ")");
  } catch (const nlohmann::json::exception& e) {  // a number beyond a double (1e999) is out_of_range
    return refuse(std::string("not valid JSON (") + e.what() + ")");
  }
}

nlohmann::json parse_untrusted_json(std::istream& in, std::string* why, JsonLimits limits) {
  std::string text;
  char buffer[65536];
  while (in && text.size() <= limits.max_bytes) {
    in.read(buffer, sizeof buffer);
    text.append(buffer, static_cast<size_t>(in.gcount()));
  }
  return parse_untrusted_json(text, why, limits);
}

}  // namespace lockstep

#pragma once
// JSON that comes from outside the process (a gRPC field, a file in a run
// folder, a cache file) is parsed only within bounds: nesting deeper than
// max_depth or text longer than max_bytes is refused before any parser or
// recursive walk sees it, so a hostile document cannot exhaust the stack.
#include <cstddef>
#include <istream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace lockstep {

struct JsonLimits {
  size_t max_bytes = 16u << 20;  // one document (a line of a .jsonl file, a gRPC field)
  int max_depth = 64;            // arrays and objects inside each other
};

// The parsed document, or a discarded value (is_discarded()) with `*why`
// saying what was wrong: too large, nested too deep, or not JSON.
nlohmann::json parse_untrusted_json(std::string_view text, std::string* why, JsonLimits limits = {});

// The same for a whole stream (a file), reading at most max_bytes + 1.
nlohmann::json parse_untrusted_json(std::istream& in, std::string* why, JsonLimits limits = {});

}  // namespace lockstep

#pragma once
// The job file's keys, one table (runtime/job/keys.cpp): each key's type,
// what is allowed and where it lives in JobConfig. Inside runtime/job/ only:
// config.cpp parses and checks values against it, and the effective
// configuration is written from it (`lockstep config`, `lockstep keys`,
// manifest.json).
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "runtime/job/config.h"

namespace lockstep {

using Value = std::variant<int64_t, double, bool, std::string>;
enum class Kind { kInt, kFloat, kBool, kString };
constexpr double kInf = std::numeric_limits<double>::infinity();

// One key of the job file: its type, what is allowed, and where it lives in
// JobConfig.
struct KeySpec {
  std::string key;
  Kind kind;
  std::function<void(JobConfig&, const Value&)> set;
  std::function<Value(const JobConfig&)> get;
  double min = -kInf;
  double max = kInf;
  bool min_open = false;  // min itself is not allowed
  std::vector<std::string> choices = {};
  bool allow_empty = false;
};

// Every key, in the order `lockstep config` writes them.
const std::vector<KeySpec>& schema();
// The key's entry ("precision" is precision.dtype), or nullptr.
const KeySpec* find_spec(std::string key);
std::string join_names(const std::vector<std::string>& items, const std::string& sep);
std::string kind_name(Kind kind);
// "an integer >= 1", "a number in (0, 1024]", "one of: sgd, adamw".
std::string allowed(const KeySpec& spec);
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace lockstep

#pragma once
// What every benchmark prints the same way: a figure over repetitions as
// median, min and max, and the processor it ran on.
#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lockstep::bench {

inline nlohmann::json summary(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return {{"median", values[values.size() / 2]}, {"min", values.front()}, {"max", values.back()},
          {"runs", values.size()}};
}

// /proc/cpuinfo's model name ("unknown" elsewhere).
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace lockstep::bench

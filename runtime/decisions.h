#pragma once
// Every automatic choice a rank makes, with its reason. record() prints
// `Decision: <what> = <value> (<reason>)` through spdlog at once and keeps the
// entry for manifest.json and the rank's events file. Not thread-safe.
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace lockstep {

struct Decision {
  std::string what;
  std::string value;
  std::string reason;
};

class DecisionLog {
 public:
  // Logs at info level; `warn` logs at warning level for choices the user
  // should act on (a reference BLAS, equal random streams, ...).
  void record(std::string what, std::string value, std::string reason, bool warn = false);
  const std::vector<Decision>& all() const { return decisions_; }
  nlohmann::json to_json() const;

 private:
  std::vector<Decision> decisions_;
};

}  // namespace lockstep

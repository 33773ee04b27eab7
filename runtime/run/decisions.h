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
  bool warn = false;  // a choice the user should act on
};

class DecisionLog {
 public:
  // Logs at info level; `warn` logs at warning level for choices the user
  // should act on (a reference BLAS, equal random streams, ...).
  void record(std::string what, std::string value, std::string reason, bool warn = false);
  const std::vector<Decision>& all() const { return decisions_; }
  nlohmann::json to_json() const;

  // Several ranks: hold() keeps the printing back (entries are kept as
  // always) so that print_held() can print each decision once. held_json()
  // is this rank's held decisions, to be exchanged; print_held() gets every
  // rank's (index = rank). Rank 0 prints each of its decisions with the
  // ranks that made the same one (`[all 4 ranks]`, `[ranks 0, 2]`); any
  // other rank prints only the ones where it differs from rank 0. Held
  // decisions that were never printed are printed by the destructor, so a
  // rank that fails before the exchange still shows every one.
  void hold();
  bool holding() const { return holding_; }
  std::string held_json() const;
  void print_held(int rank, const std::vector<std::string>& held_by_rank);
  ~DecisionLog();

 private:
  void print(const Decision& d, const std::string& ranks) const;
  std::vector<Decision> decisions_;
  bool holding_ = false;
  size_t held_from_ = 0;  // decisions_[held_from_..] are not printed yet
};

}  // namespace lockstep

#pragma once
// The two kinds of failure a user can see. Mains turn them into exit codes:
// InputError -> 2 (bad job file, bad flag, bad data file: fix the input),
// RunError   -> 1 (the run itself failed: a rank died, a check failed).
#include <stdexcept>
#include <string>
#include <vector>

namespace lockstep {

// The user's input is wrong. The message names the key, flag or file and
// what is allowed. Raised before any process group or run folder exists.
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

// The run failed after it started. The message names the step and rank
// where that is known.
class RunError : public std::runtime_error {
 public:
  explicit RunError(const std::string& message) : std::runtime_error(message) {}
};

// A control-group barrier did not complete in time. `missing_ranks` lists
// the ranks that never arrived.
class BarrierTimeout : public RunError {
 public:
  BarrierTimeout(const std::string& message, std::vector<int> missing_ranks)
      : RunError(message), missing_ranks_(std::move(missing_ranks)) {}
  const std::vector<int>& missing_ranks() const { return missing_ranks_; }

 private:
  std::vector<int> missing_ranks_;
};

}  // namespace lockstep

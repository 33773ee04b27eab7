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

// The user's model raised: its forward, its loss or its backward, in a
// training step or an evaluation. what() is one line naming the phase, the
// step and the precision, then the error's own line; detail() holds the
// whole message (a TorchScript traceback can be dozens of lines), for the
// rank's failure file in the run folder. Deterministic: a restart would
// fail the same way.
class ModelFailure : public RunError {
 public:
  ModelFailure(const std::string& summary, std::string detail) : RunError(summary), detail_(std::move(detail)) {}
  const std::string& detail() const { return detail_; }

 private:
  std::string detail_;
};

// The error itself in a LibTorch or TorchScript message, whose first lines
// are the interpreter's preamble and a traceback with code pointers: its
// last "...Error: ..." line, else its first line that is not empty.
inline std::string error_line(const std::string& message) {
  std::string found, first;
  for (size_t start = 0; start < message.size();) {
    size_t end = message.find('\n', start);
    if (end == std::string::npos) end = message.size();
    const std::string line = message.substr(start, end - start);
    if (first.empty() && line.find_first_not_of(" \t") != std::string::npos) first = line;
    const size_t at = line.find("Error: ");
    if (at != std::string::npos && at < 40) found = line;
    start = end + 1;
  }
  return found.empty() ? first : found;
}

// A collective failed in the backend (a socket reset, a peer gone): most
// often a peer that died, so whoever catches it waits for the coordinator's
// verdict on the peers before blaming itself.
class CollectiveFailed : public RunError {
 public:
  using RunError::RunError;
};

// A control-group barrier did not complete in time (a collective failure:
// the ranks that never arrived may be lost). `missing_ranks` lists
// the ranks that never arrived.
class BarrierTimeout : public CollectiveFailed {
 public:
  BarrierTimeout(const std::string& message, std::vector<int> missing_ranks)
      : CollectiveFailed(message), missing_ranks_(std::move(missing_ranks)) {}
  const std::vector<int>& missing_ranks() const { return missing_ranks_; }

 private:
  std::vector<int> missing_ranks_;
};

}  // namespace lockstep

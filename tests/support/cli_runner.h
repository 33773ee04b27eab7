#pragma once
// Helpers for tests that run the real `lockstep` binary as a child process:
// each run gets a hard timeout and is killed with its whole process group.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lockstep::testing {

struct CommandResult {
  int exit_code = -1;     // -1: killed at the timeout
  std::string output;     // stdout and stderr, interleaved
  double seconds = 0.0;
};

// Runs the lockstep binary with `args` in `cwd`, at most `timeout_s`.
CommandResult run_lockstep(const std::vector<std::string>& args, const std::string& cwd,
                           double timeout_s = 120.0);

// A fresh folder under the system temp dir, removed by the caller's TempDir.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The repository's examples/ folder.
std::string examples_dir();

// The only run folder under `runs_dir` (fails the test if not exactly one).
std::string single_run(const std::string& runs_dir);

nlohmann::json read_json(const std::string& path);
std::vector<nlohmann::json> read_json_lines(const std::string& path);

}  // namespace lockstep::testing

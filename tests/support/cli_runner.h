#pragma once
// Helpers for tests that run the real `lockstep` binary as a child process:
// each run gets a hard timeout and is killed with its whole process group.
#include <sys/types.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/shell.h"

namespace lockstep::testing {

struct CommandResult {
  int exit_code = -1;     // -1: killed at the timeout
  std::string output;     // stdout and stderr, interleaved
  double seconds = 0.0;
};

// A lockstep process started in the background, in its own process group.
// The destructor kills the whole group: nothing a test starts outlives it.
class LockstepProcess {
 public:
  // `env` entries ("NAME=value") are added to this process's environment.
  // `prefix` (a command found on PATH, with its arguments) runs the binary:
  // `taskset -c 0`, or a namespace host's wrapper (support/net_hosts.h);
  // it must exec it, so the pid stays the binary's.
  LockstepProcess(const std::vector<std::string>& args, const std::string& cwd,
                  const std::vector<std::string>& env = {},
                  const std::vector<std::string>& prefix = {});
  ~LockstepProcess();
  LockstepProcess(const LockstepProcess&) = delete;
  LockstepProcess& operator=(const LockstepProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Everything printed so far (a thread reads the child's output as it
  // comes, so a child never blocks on a full pipe).
  std::string output();
  // Waits until the output contains `text`; false at the timeout.
  bool wait_for_output(const std::string& text, double timeout_s);
  // Waits for the exit; returns the exit code, 128 + signal, or -1 at the timeout.
  int wait(double timeout_s);
  bool running();
  void signal(int signal_number);  // the process itself
  void kill_group();               // SIGKILL to its whole group

 private:
  void drain(int timeout_ms);  // waits up to timeout_ms for more output
  pid_t pid_ = -1;
  int output_fd_ = -1;
  std::thread reader_;
  std::atomic<bool> stop_reading_{false}, ended_{false};
  std::mutex mutex_;
  std::string output_;  // guarded by mutex_
  bool exited_ = false;
  int exit_code_ = -1;
};

// Runs the lockstep binary with `args` in `cwd`, at most `timeout_s`.
CommandResult run_lockstep(const std::vector<std::string>& args, const std::string& cwd,
                           double timeout_s = 120.0, const std::vector<std::string>& env = {},
                           const std::vector<std::string>& prefix = {});

// A loopback port nobody listens on right now (bound to port 0, read back, closed).
int free_port();

// The repository's examples/ folder.
std::string examples_dir();

// The only run folder under `runs_dir` (fails the test if not exactly one).
std::string single_run(const std::string& runs_dir);

nlohmann::json read_json(const std::string& path);
std::vector<nlohmann::json> read_json_lines(const std::string& path);

}  // namespace lockstep::testing

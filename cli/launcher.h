#pragma once
// The local launcher behind `lockstep run`: starts N worker processes that
// join the (embedded) coordinator, with posix_spawn (never fork: the launcher holds
// LibTorch threads), streams their output with a rank prefix, and on the
// first failure stops the others, unless the coordinator restarts the job:
// then it starts a replacement for the worker that ended.
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace lockstep {

struct LaunchOptions {
  std::string executable;               // the lockstep binary to spawn
  std::string coordinator;              // HOST:PORT every worker joins
  std::string token;                    // LOCKSTEP_TOKEN for every worker
  int nproc = 1;
  bool terminal = false;                // our stdout is a terminal
  bool quiet = false;                   // workers log warnings and errors only (--quiet)
  double stop_grace_s = 5;              // SIGTERM, then SIGKILL after this
  // Asked when a worker ends unsuccessfully (`what`: "exited with status 1",
  // ...; `bad_input`: status 2): true = the job goes on, start a replacement
  // with the same LOCAL_RANK. Unset: every failure stops the launch.
  std::function<bool(pid_t pid, const std::string& what, bool bad_input)> replace;
  // Called once, from the launcher's loop, when it receives SIGUSR1: the job
  // should stop at a checkpoint. Unset: SIGUSR1 is passed on to every worker.
  std::function<void()> stop;
};

// Worker i gets LOCAL_RANK = i, so the coordinator's ordering (host, local
// rank) makes it rank i. Runs the workers to the end. Returns the exit code for `lockstep run`:
// 0 when every rank succeeded; 2 when the first failure that was not
// replaced was an exit with 2 (bad input); 1 otherwise. Names that rank and
// its status.
int launch_local(const LaunchOptions& options);

// The signal (SIGINT, SIGTERM) that interrupted launch_local, or 0.
int launcher_interrupted_by();

}  // namespace lockstep

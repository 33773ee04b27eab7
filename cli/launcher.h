#pragma once
// The local launcher behind `lockstep run`: starts N worker processes that
// join the (embedded) coordinator, with posix_spawn (never fork: the launcher holds
// LibTorch threads), streams their output with a rank prefix, and on the
// first failure stops the others.
#include <string>
#include <vector>

namespace lockstep {

struct LaunchOptions {
  std::string executable;               // the lockstep binary to spawn
  std::string coordinator;              // HOST:PORT every worker joins
  std::string token;                    // LOCKSTEP_TOKEN for every worker
  int nproc = 1;
  int threads_per_rank = 1;             // OMP_NUM_THREADS / OPENBLAS_NUM_THREADS
  bool terminal = false;                // our stdout is a terminal
  double stop_grace_s = 5;              // SIGTERM, then SIGKILL after this
  int restart_count = 0;                // generation: TORCHELASTIC_RESTART_COUNT, LOCKSTEP_RESTART_COUNT
};

// What ended a launch that failed.
struct LaunchFailure {
  int rank = -1;             // the first rank to fail (-1: none, or interrupted)
  std::string what;          // "rank 1 killed by signal 9", ...
  double unix_s = 0;         // when the launcher saw it
  bool interrupted = false;  // SIGINT / SIGTERM to the launcher
};

// Worker i gets LOCAL_RANK = i, so the coordinator's ordering (host, local
// rank) makes it rank i. Runs the workers to the end. Returns the exit code for `lockstep run`:
// 0 when every rank succeeded; 2 when the first rank to fail exited with 2
// (bad input); 1 otherwise. Names the first failing rank and its status.
// `failure` (may be null) is filled when the launch fails.
int launch_local(const LaunchOptions& options, LaunchFailure* failure = nullptr);

}  // namespace lockstep

#pragma once
// A worker's heartbeat to the coordinator, on its own thread: every period
// it sends the latest step, phase, loss and throughput. The reply can end
// the run: STOP (or this process's own stop signal) sets stop_requested();
// ABORT (a peer is gone, collectives
// will never complete) ends this process at once with exit status 1, since
// a rank blocked in a Gloo collective cannot be unwound; REJOIN (the job
// restarts without the lost peer) ends the generation (runtime/generation.h)
// so the training thread unwinds and joins again; one that has not stopped
// this loop within `rejoin_grace` is ended like ABORT, for its launcher or
// supervisor to replace. A coordinator that
// stays unreachable for longer than `timeout` ends the process the same way:
// nothing waits forever.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/train/run_observer.h"
#include "worker/coordinator_client.h"

namespace lockstep {

struct HeartbeatOptions {
  std::string run_id;
  int rank = 0;
  int64_t generation = 0;
  std::chrono::milliseconds period{1000};
  std::chrono::milliseconds timeout{10000};
  std::chrono::milliseconds rejoin_grace{60000};
  // Set by a signal handler (SIGUSR1 to this worker): this rank asks, like
  // STOP, that every rank stop after a step they agree on.
  const std::atomic<bool>* stop_signal = nullptr;
  // Called with the reason just before this loop ends the process because
  // the coordinator is lost (after ABORT the coordinator, alive, writes the
  // manifest itself): rank 0 records the end in the run folder's manifest.
  std::function<void(const std::string& why)> on_coordinator_lost;
};

class HeartbeatLoop : public RunObserver {
 public:
  HeartbeatLoop(CoordinatorClient& client, HeartbeatOptions options);
  ~HeartbeatLoop() override;  // stops the thread

  void on_phase(const std::string& phase) override;
  void on_step(int64_t step, double loss, double samples_per_s) override;
  void on_total_steps(int64_t total) override;
  void on_audit(const nlohmann::json& summary) override;
  void on_eval(const std::string& summary) override;
  void on_skipped_files(int64_t before_training, int64_t in_batches) override;
  void on_skipped_steps(int64_t total) override;
  bool stop_requested() override;
  // True once the coordinator answered REGROUP. Asked when every rank has
  // agreed to stop: a peer may have heard REGROUP first and this rank not
  // yet, so it asks the coordinator then and there.
  bool regroup_requested() override;

  // Stops sending (before the final Report).
  void stop();
  // After an error on the training thread: waits at most `timeout` for the
  // coordinator's verdict. True when it ended the generation (rejoin); an
  // ABORT never returns (the process ends).
  bool wait_for_generation_end(std::chrono::milliseconds timeout);

 private:
  void run();
  [[noreturn]] void leave(const std::string& why);

  CoordinatorClient& client_;
  const HeartbeatOptions options_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable verdict_;
  bool stopping_ = false;        // guarded by mutex_
  v1::HeartbeatRequest latest_;  // guarded by mutex_
  std::vector<std::string> unsent_audits_;  // guarded by mutex_
  bool eval_unsent_ = false;                // guarded by mutex_
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> regroup_requested_{false};
  std::thread thread_;
};

}  // namespace lockstep

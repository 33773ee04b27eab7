#pragma once
// The coordinator's view of one job: who joined, which rank each got, their
// heartbeats, and how the job ends. Thread-safe: every gRPC handler and the
// liveness monitor call into one JobState.
//
// Protocol, as the coordinator runs it:
//   1. waiting: Join calls block until job.world_size workers have joined
//      or the rendezvous deadline passes (then: failed, naming who joined);
//   2. when the last worker joins, ranks are assigned in a stable order
//      (claimed ranks first, then by host name, local rank, join order), the
//      generation starts, every Join returns: running;
//   3. running: heartbeats update each rank's row; a rank silent for longer
//      than the heartbeat timeout, or a rank that reports failure, fails the
//      job, and every other rank's next heartbeat is answered ABORT;
//   4. completed when every rank reported success.
// With fault.max_restarts > 0 a lost rank (dead, silent, or a process the
// launcher saw end) restarts the job instead of failing it, while the budget
// lasts: the generation ends, live ranks of it are answered REJOIN and join
// again from the same process, replacements join too, and the next
// generation starts from step 1 of the protocol with `resume` set, so every
// rank continues from the newest complete checkpoint. Each restart is
// counted, with its reason, in the status and in manifest.json.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/support/status.h>
#include <nlohmann/json.hpp>

#include "lockstep/proto/lockstep.pb.h"
#include "runtime/run/run_folder.h"

namespace lockstep {

struct JobStateOptions {
  std::string run_id;
  int world_size = 1;
  int64_t seed = 0;
  std::vector<std::string> settings;  // the effective job configuration
  std::map<std::string, std::string> sources;  // where each setting came from
  std::string job_file;
  std::string folder_marker;  // contents of the coordinator's <run folder>/.coordinator
  std::chrono::milliseconds rendezvous_timeout{120000};
  std::chrono::milliseconds heartbeat_timeout{10000};
  std::chrono::milliseconds heartbeat_period{1000};  // what workers were told to keep
  std::string audit_log;  // audit.jsonl: one line per audited step ("" = keep none)
  int64_t generation = 1;  // the one that starts when every worker has joined (restarts: 2, 3, ...)
  int max_restarts = 0;    // fault.max_restarts: lost workers the job survives
  // The elastic range (elastic.*): with min_ranks below world_size (the
  // maximum) a loss that no replacement makes good within replace_wait
  // lets the job go on with the largest world size the workers there fill
  // that divides `microbatches` (k of a step), and workers that join later
  // make it grow again. Losses are then bounded per host, not in total.
  int min_ranks = 0;                               // 0: world_size (not elastic)
  std::chrono::milliseconds replace_wait{5000};
  int64_t microbatches = 0;                        // 0: any world size divides the work
  int max_host_losses = 3;                         // a host lost this often is kept out
  // Called (under the job's lock: keep it short) with the pid of a rank the
  // liveness check declared dead; `lockstep run` kills its child there.
  std::function<void(int pid)> on_rank_declared_dead;
};

class JobState {
 public:
  using Clock = std::chrono::steady_clock;
  // kStopped: every rank stopped on request (request_stop) after the same
  // step; the job is to be resumed, not over.
  enum class State { kWaiting, kRunning, kCompleted, kFailed, kStopped };

  explicit JobState(JobStateOptions options);

  // Blocks (at most until the rendezvous deadline or `give_up`) until the
  // job is full; fills `reply`. Errors carry the gRPC status the issue
  // names: RESOURCE_EXHAUSTED (full), FAILED_PRECONDITION (API version,
  // duplicate claim), NOT_FOUND (run id), DEADLINE_EXCEEDED (rendezvous).
  // A caller for whom `caller_gone` turns true while it waits (its call was
  // cancelled: the worker died) is taken off the list: its place is free.
  grpc::Status join(const v1::JoinRequest& request, const std::string& peer,
                    Clock::time_point give_up, v1::JoinReply* reply,
                    const std::function<bool()>& caller_gone = {});
  grpc::Status heartbeat(const v1::HeartbeatRequest& request, v1::HeartbeatReply* reply);
  grpc::Status report(const v1::ReportRequest& request);
  void status(v1::StatusReply* reply) const;

  // Declares ranks dead whose heartbeat is too old, and fails a rendezvous
  // that ran out of time. Called periodically by the monitor.
  void check_liveness();
  // Fails the job from outside.
  void fail(const std::string& reason);
  // Fails the job because someone asked (a signal to the coordinator or to
  // `lockstep run`): the same for the ranks, "cancelled" in the manifest.
  void cancel(const std::string& reason);
  bool cancelled() const;
  // The first audited step at which the ranks disagreed (-1: none yet),
  // and how many of how many audits did. A completed job with drift is
  // "completed_with_drift", not "completed".
  int64_t first_drift_step() const;
  std::string drift_summary() const;
  // Asks every rank to stop after a step they agree on, with a checkpoint
  // there (Slurm's USR1 before the time limit); the job ends stopped.
  // Before training started the job just ends stopped; after it ended,
  // nothing happens.
  void request_stop(const std::string& reason);
  // The step the ranks stopped after (kStopped), else 0.
  int64_t stopped_at_step() const;
  // A launcher saw worker process `pid` end unsuccessfully (`what`: "was
  // killed by signal 9", ...; `bad_input`: it exited with status 2). Returns
  // true when the job goes on and wants a replacement process, false when
  // the job failed (or had already ended).
  bool process_ended(int pid, const std::string& what, bool bad_input);

  // Waits until the job has ended (completed, failed or stopped), at most `timeout`.
  bool wait_until_ended(std::chrono::milliseconds timeout) const;
  // After a failure: waits until every live rank was told to abort or has
  // reported, at most `timeout`.
  void wait_until_told(std::chrono::milliseconds timeout) const;
  State state() const;
  std::string failure() const;
  const std::string& run_id() const { return options_.run_id; }
  int world_size() const { return options_.world_size; }  // the most ranks (the elastic maximum)
  // The coordinator's view for manifest.json.
  nlohmann::json to_json() const;

 private:
  struct Worker {
    std::string host;
    int local_rank = -1;
    int pid = 0;
    std::string peer;
    int join_order = 0;
    std::string joined_at;
    int rank = -1;
    int local_world_size = 1;
    int local_index = 0;
    std::string state = "joined";  // joined | running | finished | stopped | failed | dead
    Clock::time_point last_heartbeat{};
    bool heartbeat_seen = false;
    int heartbeats = 0;
    double max_heartbeat_gap_s = 0;
    int64_t heartbeats_missed = 0;  // periods that passed without one
    int64_t step = 0;
    double loss = 0;
    double samples_per_s = 0;
    std::string phase;
    std::string audit;
    int64_t files_skipped_in_batches = 0;  // data.bad_files = skip, this rank
    int64_t total_steps = 0;               // what the rank trains to; 0 unknown
    int64_t skipped_steps = 0;             // optimizer steps that trained nothing
    int64_t pace_from_step = -1;           // the first step heard of in training, and when
    Clock::time_point pace_from{};
    bool told_to_abort = false;
    std::string error;
    nlohmann::json metrics;
    int64_t previous_generation = 0;  // the generation this process came back from (0: new)
  };

  bool ended_locked() const;  // completed, failed or stopped
  // `w` of the running generation is lost for `why`: marked dead, and kept
  // out should its process come back.
  void declare_lost_locked(Worker& w, const std::string& why);
  void assign_ranks_locked();
  void fail_locked(const std::string& reason);
  bool elastic() const { return options_.min_ranks > 0 && options_.min_ranks < options_.world_size; }
  // The largest world size in the elastic range that `workers` fill and
  // that divides the step's microbatches; 0 when none.
  int best_world_size(int workers) const;
  // Starts the forming generation when it is full, or (elastic) when the
  // wait for replacements is over and the workers there fill a world size.
  void maybe_start_locked(Clock::time_point now);
  void start_generation_locked(int world, const std::string& why);
  // An elastic job grows: the running generation ends after a step every
  // rank agrees on (REGROUP), and the next forms with `world` ranks.
  void regroup_locked(const std::string& reason, int world);
  // A worker joins a running elastic job: OK when it makes the job grow
  // (the generation ends in a regroup, the worker joins the next one),
  // else UNAVAILABLE "standby: ...", saying how many more it takes.
  grpc::Status stand_by_or_grow_locked(const v1::JoinRequest& request);
  // The generation ends (a loss or a regroup): its live processes are
  // awaited back, its workers' ends are expected, the next one forms.
  void end_generation_locked(const std::string& reason, bool regroup);
  // A worker is lost: a new generation while fault.max_restarts allows,
  // else the job fails with `reason`.
  void restart_or_fail_locked(const std::string& reason, int dead_rank);
  // A host whose rank computed wrong (audit.on_miscompute = exclude): lost
  // for good, the generation ends, the job goes on without it.
  void exclude_host_locked(const std::string& host, const std::string& reason, int rank);
  bool rendezvous_expired_locked(Clock::time_point now) const;
  // A call from a rank of a generation that ended in a restart.
  bool from_ended_generation_locked(const std::string& run_id, int64_t generation) const;
  void record_audits_locked(int rank, std::vector<nlohmann::json>& audits);
  std::string who_joined_locked() const;
  // A worker's state for views: "aborted" (told to leave) or "lost" (no
  // word) for one still marked running after the job ended.
  std::string rank_state_locked(const Worker& w) const;
  nlohmann::json workers_json_locked() const;
  Worker* find_locked(const std::string& run_id, int rank, int64_t generation, grpc::Status* error);
  // workers_ is changed only through these, which keep the indexes below
  // in step: a heartbeat finds its rank, and a join checks its slot, in
  // time that does not grow with the number of workers.
  void add_worker_locked(Worker worker);
  void erase_worker_locked(std::vector<Worker>::iterator w);
  void clear_workers_locked();
  static const char* state_name(State state);
  static double seconds_between(Clock::time_point a, Clock::time_point b);  // b - a, in seconds

  const JobStateOptions options_;
  const Clock::time_point created_ = Clock::now();
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  State state_ = State::kWaiting;       // guarded by mutex_
  std::vector<Worker> workers_;         // guarded by mutex_; in join order
  std::vector<size_t> index_of_rank_;   // guarded by mutex_; rank -> index in workers_ (while running)
  std::map<std::pair<std::string, int>, int> slots_;  // guarded by mutex_; (host, local rank) joined
  std::set<int> claimed_ranks_;         // guarded by mutex_; ranks claimed by workers_ (RANK)
  int waiting_joins_ = 0;               // guarded by mutex_; Join calls held for the rendezvous
  // Elastic membership, all guarded by mutex_:
  int world_size_ = 0;                  // the forming (or running) generation's world size
  int running_world_size_ = 0;          // the last generation that ran (0: none yet)
  Clock::time_point ended_at_{};        // the last generation's end (a loss or a regroup)
  std::string end_reason_;              // ... and why
  bool ended_by_regroup_ = false;       // ... a regroup (REGROUP to its ranks) rather than a loss (REJOIN)
  int64_t step_at_end_ = 0;             // the furthest step its ranks had reported
  std::set<std::pair<std::string, int>> awaited_;  // its live processes (host, pid), until they rejoin
  std::map<std::string, int> host_losses_;         // ranks lost per host
  std::map<std::string, std::string> excluded_hosts_;  // host -> why (a miscompute)
  std::map<std::pair<std::string, int>, Clock::time_point> standbys_;  // told to stand by; last asked
  std::set<int> standby_orders_;        // join orders left out of a starting generation
  nlohmann::json membership_ = nlohmann::json::array();  // every generation after the first
  std::string failure_;                 // guarded by mutex_
  // The job's failure came from a rank that only lost its peer: a later
  // report of a rank's own error replaces it as the root cause.
  bool failure_from_lost_peer_ = false;
  bool cancelled_ = false;              // the failure was a cancellation; guarded by mutex_
  std::string stop_reason_;             // guarded by mutex_; "" while no stop was asked for
  int64_t stopped_at_step_ = 0;         // guarded by mutex_
  int64_t generation_;                  // guarded by mutex_; forming or running
  Clock::time_point waiting_since_;     // guarded by mutex_; this rendezvous began
  nlohmann::json restarts_ = nlohmann::json::array();   // guarded by mutex_
  nlohmann::json earlier_generations_ = nlohmann::json::array();  // guarded by mutex_
  int joins_ = 0;                       // guarded by mutex_; every Join so far
  std::set<int> earlier_pids_;          // guarded by mutex_; processes of restarted generations
  // Processes declared lost (host, pid) and their ranks (generation, rank):
  // one that comes back (a frozen process thawed, a link restored) is
  // refused, never merged into a later generation. Guarded by mutex_.
  std::set<std::pair<std::string, int>> lost_processes_;
  std::map<std::pair<int64_t, int>, std::string> lost_ranks_;  // -> why it was declared lost
  std::set<int64_t> audited_steps_;     // guarded by mutex_
  std::string last_audit_;              // guarded by mutex_
  std::string last_eval_;               // guarded by mutex_
  int64_t files_skipped_before_training_ = 0;  // guarded by mutex_; the same on every rank
  int64_t first_drift_step_ = -1;       // the first audit that found the ranks apart; guarded by mutex_
  int64_t drifted_audits_ = 0;          // guarded by mutex_
  int64_t audits_ = 0;                  // audited steps heard of; guarded by mutex_
  bool audit_log_failed_ = false;       // audit.jsonl could not be written; guarded by mutex_
  std::unique_ptr<EventWriter> audit_log_;  // guarded by mutex_; opened at the first audit
};

}  // namespace lockstep

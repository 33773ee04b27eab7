// JobState's restart policy: what a lost rank costs (a restart from the
// newest checkpoint while fault.max_restarts allows, else the job), how a
// lost rank is found (a process that ended, a heartbeat that stopped).
#include "coordinator/job_state.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "runtime/run/run_folder.h"

namespace lockstep {

void JobState::restart_or_fail_locked(const std::string& reason, int dead_rank) {
  if (ended_locked()) return;
  // An elastic job's losses are bounded per host (elastic.max_host_losses,
  // at join), not in total.
  if (!elastic() && int(restarts_.size()) >= options_.max_restarts) {
    fail_locked(options_.max_restarts == 0
                    ? reason
                    : reason + "; the restart budget is spent (fault.max_restarts = " +
                          std::to_string(options_.max_restarts) + ")");
    return;
  }
  int64_t last_step = 0;
  for (const auto& w : workers_) last_step = std::max(last_step, w.step);
  for (const auto& w : workers_)
    if (w.rank == dead_rank && state_ == State::kRunning && ++host_losses_[w.host] == options_.max_host_losses)
      spdlog::warn("Decision: keep_out = {} (lost {} times: elastic.max_host_losses = {}; its workers' "
                   "joins are refused from now on)", w.host, host_losses_[w.host], options_.max_host_losses);
  const bool was_running = state_ == State::kRunning;
  if (was_running) end_generation_locked(reason, /*regroup=*/false);  // its processes may come back
  waiting_since_ = Clock::now();
  restarts_.push_back(
      {{"generation", generation_},
       {"reason", reason},
       {"dead_rank", dead_rank},
       {"died_at", utc_timestamp()},
       {"died_unix_s",
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
       {"last_step_reported", last_step},
       {"during", was_running ? "training" : "the rendezvous"}});
  const int left = options_.max_restarts - int(restarts_.size());
  if (elastic())
    spdlog::warn("Decision: restart = generation {} ({}; elastic {}..{} ranks: live ranks rejoin from their "
                 "processes with the state in memory; a replacement may join within elastic.replace_wait_s = "
                 "{:g} s, else the job goes on with the largest world size the workers there fill)",
                 generation_, reason, options_.min_ranks, options_.world_size,
                 options_.replace_wait.count() / 1000.0);
  else
    spdlog::warn("Decision: restart = generation {} ({}; fault.max_restarts = {}, {} left after this "
                 "one; live ranks rejoin from their processes, lost ones are replaced, and every rank "
                 "continues from the newest complete checkpoint)",
                 generation_, reason, options_.max_restarts, left);
  changed_.notify_all();
}

void JobState::exclude_host_locked(const std::string& host, const std::string& reason, int rank) {
  const std::string line = reason.substr(0, std::min(reason.find('\n'), size_t(2000)));
  if (!elastic()) {  // refused at the start; a worker of another version could still ask
    fail_locked("host " + host + " computed wrong and audit.on_miscompute = exclude needs an elastic job: " + line);
    return;
  }
  excluded_hosts_[host] = line;
  spdlog::warn("Decision: exclude = {} (rank {} reported: {}; its ranks are lost and its workers refused from "
               "now on, the job goes on without it)", host, rank, line);
  int owner = -1;
  for (auto& w : workers_)
    if (w.host == host && w.state == "running") {
      declare_lost_locked(w, "host " + host + " excluded: it computed wrong");
      if (owner < 0) owner = w.rank;
    }
  restart_or_fail_locked("host " + host + " excluded (audit.on_miscompute = exclude): " + line, owner);
}

void JobState::end_generation_locked(const std::string& reason, bool regroup) {
  earlier_generations_.push_back({{"generation", generation_}, {"workers", workers_json_locked()}});
  step_at_end_ = 0;
  awaited_.clear();
  // Awaited back: the processes still heard from. One silent for half the
  // heartbeat timeout is lost with the one declared dead (a host's other
  // ranks behind the same cut link), and the job does not wait for it.
  const auto now = Clock::now();
  const auto heard = std::min<Clock::duration>(options_.heartbeat_timeout / 2, options_.heartbeat_period * 5);
  for (const auto& w : workers_) {
    step_at_end_ = std::max(step_at_end_, w.step);
    // Their ends are expected now: each gets a replacement, none counts as
    // another failure (the dead one's included: declared dead by silence,
    // its process may end only later).
    earlier_pids_.insert(w.pid);
    if (w.state == "running" && now - w.last_heartbeat <= heard) awaited_.insert({w.host, w.pid});
  }
  clear_workers_locked();
  ++generation_;
  state_ = State::kWaiting;
  ended_at_ = Clock::now();
  end_reason_ = reason;
  ended_by_regroup_ = regroup;
  world_size_ = options_.world_size;  // a loss: replacements may fill it again
  changed_.notify_all();
}

void JobState::regroup_locked(const std::string& reason, int world) {
  end_generation_locked(reason, /*regroup=*/true);
  world_size_ = world;
  waiting_since_ = Clock::now();
  spdlog::warn("Decision: regroup = generation {} on {} ranks ({}; every rank stops after a step they agree "
               "on, keeps its state in memory and rejoins; the new ones get the state from a live peer)",
               generation_, world, reason);
}

void JobState::declare_lost_locked(Worker& w, const std::string& why) {
  w.state = "dead";
  lost_processes_.insert({w.host, w.pid});
  lost_ranks_[{generation_, w.rank}] = why;
}

bool JobState::process_ended(int pid, const std::string& what, bool bad_input) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ended_locked()) return false;
  auto w = std::find_if(workers_.begin(), workers_.end(), [&](const Worker& x) { return x.pid == pid; });
  std::string reason;
  int rank = -1;
  if (w == workers_.end()) {
    // A process of a restarted generation that could not rejoin: replace it,
    // that restart is counted already.
    if (earlier_pids_.erase(pid)) {
      for (auto a = awaited_.begin(); a != awaited_.end();)  // it will not rejoin
        a = a->second == pid ? awaited_.erase(a) : std::next(a);
      maybe_start_locked(Clock::now());
      return true;
    }
    reason = "a worker process (pid " + std::to_string(pid) + ") " + what + " before it joined";
  } else {
    if (w->state == "finished") return false;
    reason = (w->rank >= 0 ? "rank " + std::to_string(w->rank) : "a joined worker") + " (" +
             w->host + " pid " + std::to_string(pid) + ") " + what;
    if (state_ == State::kWaiting) {
      erase_worker_locked(w);  // still forming: the replacement takes its place
    } else {
      rank = w->rank;
      declare_lost_locked(*w, reason);
      spdlog::error("coordinator: {} at step {}", reason, w->step);
    }
  }
  if (bad_input) fail_locked(reason + ": bad input, a restart would fail the same way");
  else restart_or_fail_locked(reason, rank);
  return state_ != State::kFailed;
}

void JobState::check_liveness() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  if (rendezvous_expired_locked(now)) {
    fail_locked("rendezvous timed out after " +
                std::to_string(options_.rendezvous_timeout.count() / 1000.0).substr(0, 5) +
                " s: " + who_joined_locked());
    return;
  }
  if (state_ == State::kWaiting) {
    maybe_start_locked(now);  // an elastic job's wait for replacements may be over
    return;
  }
  if (state_ != State::kRunning && state_ != State::kFailed) return;
  for (auto& w : workers_) {
    if (w.state != "running" || state_ == State::kWaiting) continue;
    double silent = seconds_between(w.last_heartbeat, now);
    if (silent * 1000.0 <= double(options_.heartbeat_timeout.count())) continue;
    spdlog::error("coordinator: rank {} ({} pid {}) declared dead: no heartbeat for {:.1f} s "
                  "(fault.heartbeat_timeout_s = {:g}), last step {}",
                  w.rank, w.host, w.pid, silent, options_.heartbeat_timeout.count() / 1000.0, w.step);
    const std::string reason = "rank " + std::to_string(w.rank) + " (" + w.host + " pid " +
                               std::to_string(w.pid) + ") is dead: no heartbeat for " +
                               std::to_string(silent).substr(0, 4) + " s, last step " +
                               std::to_string(w.step);
    declare_lost_locked(w, reason);
    if (options_.on_rank_declared_dead) options_.on_rank_declared_dead(w.pid);
    if (state_ == State::kRunning) {
      restart_or_fail_locked(reason, w.rank);  // may end this generation: workers_ is cleared
      return;
    }
    fail_locked(reason);
  }
}

}  // namespace lockstep

// JobState's membership: who joins, in which order each gets its rank,
// when a generation starts (the rendezvous), and what a replacement that
// names its slot means for a running job.
#include "coordinator/job_state.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "runtime/run/run_folder.h"

namespace lockstep {
namespace {

constexpr const char* kApiVersion = "lockstep.v1";  // what a worker's Join must speak

}  // namespace

void JobState::assign_ranks_locked() {
  std::vector<Worker*> order;
  for (auto& w : workers_) order.push_back(&w);
  // Stable order: host name, then local rank, then join order.
  std::sort(order.begin(), order.end(), [](const Worker* a, const Worker* b) {
    if (a->host != b->host) return a->host < b->host;
    if (a->local_rank != b->local_rank) return a->local_rank < b->local_rank;
    return a->join_order < b->join_order;
  });
  std::vector<bool> taken(size_t(world_size_), false);
  index_of_rank_.assign(size_t(world_size_), 0);
  for (auto* w : order) {
    if (w->rank >= world_size_) {  // an elastic generation with fewer ranks: the claim cannot hold
      spdlog::warn("coordinator: {} pid {} claimed rank {}, but generation {} has {} ranks: it gets another",
                   w->host, w->pid, w->rank, generation_, world_size_);
      w->rank = -1;
    }
    if (w->rank >= 0) taken[size_t(w->rank)] = true;  // claims were checked at join
  }
  size_t next = 0;
  std::string placed, claims;
  for (size_t i = 0; i < order.size(); ++i) {
    Worker* w = order[i];
    const bool claimed = w->rank >= 0;
    if (!claimed) {
      while (taken[next]) ++next;
      w->rank = int(next);
      taken[next] = true;
    } else {
      claims += (claims.empty() ? "" : ", ") + std::to_string(w->rank);
    }
    if (i < 16)  // one line for the job, however many ranks
      placed += fmt::format("{}rank {} = {}:{} pid {}", placed.empty() ? "" : ", ", w->rank, w->host, w->local_rank,
                            w->pid);
    else if (i == 16)
      placed += fmt::format(", ... ({} more)", order.size() - 16);
  }
  spdlog::info("Decision: ranks = {} (sorted by host name, local rank, join order{})", placed,
               claims.empty() ? "" : "; claimed by the worker (RANK): " + claims);
  // Each host's workers, in rank order: the count and each one's place.
  // `order` is sorted by host first, so a host's workers are adjacent.
  for (size_t i = 0; i < order.size();) {
    size_t end = i;
    while (end < order.size() && order[end]->host == order[i]->host) ++end;
    std::vector<Worker*> host(order.begin() + long(i), order.begin() + long(end));
    std::sort(host.begin(), host.end(), [](const Worker* a, const Worker* b) { return a->rank < b->rank; });
    for (size_t j = 0; j < host.size(); ++j) {
      host[j]->local_world_size = int(host.size());
      host[j]->local_index = int(j);
    }
    i = end;
  }
  for (size_t i = 0; i < workers_.size(); ++i) index_of_rank_[size_t(workers_[i].rank)] = i;
}

grpc::Status JobState::join(const v1::JoinRequest& request, const std::string& peer,
                            Clock::time_point give_up, v1::JoinReply* reply,
                            const std::function<bool()>& caller_gone) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (request.api_version() != kApiVersion)
    return {grpc::StatusCode::FAILED_PRECONDITION,
            "this coordinator speaks " + std::string(kApiVersion) + ", the worker " +
                (request.api_version().empty() ? "no version" : request.api_version()) +
                "; run the same lockstep version on both"};
  if (!request.run_id().empty() && request.run_id() != options_.run_id)
    return {grpc::StatusCode::NOT_FOUND,
            "unknown run id '" + request.run_id() + "': this coordinator runs '" +
                options_.run_id + "'"};
  if (auto excluded = excluded_hosts_.find(request.hostname()); excluded != excluded_hosts_.end())
    return {grpc::StatusCode::ABORTED, "host " + request.hostname() + " was excluded from this job: " +
                                           excluded->second + "; the job goes on without it"};
  // A new process from a host lost that often is refused; one that survived
  // on it (it rejoins from its own process) is not lost.
  if (auto lost = host_losses_.find(request.hostname()); request.previous_generation() == 0 &&
                                                         lost != host_losses_.end() &&
                                                         lost->second >= options_.max_host_losses)
    return {grpc::StatusCode::ABORTED,
            "host " + request.hostname() + " was lost " + std::to_string(lost->second) + " times in this job "
            "(elastic.max_host_losses = " + std::to_string(options_.max_host_losses) + "): it is kept out; "
            "the job goes on without it"};
  if (request.previous_generation() > 0 && lost_processes_.count({request.hostname(), request.pid()}))
    return {grpc::StatusCode::ABORTED,
            request.hostname() + " pid " + std::to_string(request.pid()) + " was declared lost in generation " +
                std::to_string(request.previous_generation()) + " and the job went on without it: a "
                "process that comes back is not merged (its state is that of a step the others have "
                "left); start a new worker on that host to rejoin the job"};
  if (state_ == State::kRunning && (elastic() || int(restarts_.size()) < options_.max_restarts)) {
    // A replacement, started by a supervisor that saw a worker die. When it
    // names its slot (LOCAL_RANK) and that slot's rank is still listed as
    // running, the old process is gone: restart now rather than after the
    // heartbeat timeout.
    auto same_slot = std::find_if(workers_.begin(), workers_.end(), [&](const Worker& w) {
      return request.local_rank() >= 0 && w.host == request.hostname() &&
             w.local_rank == request.local_rank() && w.state == "running";
    });
    if (same_slot != workers_.end()) {
      const std::string why = "rank " + std::to_string(same_slot->rank) + " (" + same_slot->host +
                              " pid " + std::to_string(same_slot->pid) + ") was replaced: " +
                              "pid " + std::to_string(request.pid()) + " joined for its slot " +
                              "(local rank " + std::to_string(request.local_rank()) + ")";
      declare_lost_locked(*same_slot, why);
      restart_or_fail_locked(why, same_slot->rank);
    } else if (elastic()) {
      // A worker that joins a running elastic job (a host came back, a new
      // one): the job grows when the workers waiting fill a larger world
      // size; until then each waits as a standby and asks again.
      if (auto refused = stand_by_or_grow_locked(request); !refused.ok()) return refused;
    } else {
      spdlog::info("coordinator: {} pid {} arrived while generation {} runs: it waits as a "
                   "replacement for the next generation", request.hostname(), request.pid(),
                   generation_);
      changed_.wait_until(lock, give_up, [&] { return state_ != State::kRunning; });
    }
  }
  if (ended_locked())
    return {grpc::StatusCode::ABORTED, "job " + options_.run_id + " has ended (" +
                                           state_name(state_) + "): nothing to join"};
  if (state_ != State::kWaiting || int(workers_.size()) >= world_size_)
    return {grpc::StatusCode::RESOURCE_EXHAUSTED,
            "job " + options_.run_id + " is full: " + std::to_string(workers_.size()) + " of " +
                std::to_string(world_size_) + " workers joined, state " +
                state_name(state_)};
  if (request.has_claimed_rank()) {
    int claim = request.claimed_rank();
    if (claim < 0 || claim >= options_.world_size)
      return {grpc::StatusCode::FAILED_PRECONDITION,
              "claimed rank " + std::to_string(claim) + " is outside 0.." +
                  std::to_string(options_.world_size - 1)};
    if (claimed_ranks_.count(claim))
      for (const auto& w : workers_)  // found: said once, the scan is for its name
        if (w.rank == claim)
          return {grpc::StatusCode::FAILED_PRECONDITION,
                  "rank " + std::to_string(claim) + " is already claimed by " + w.host + " pid " +
                      std::to_string(w.pid)};
  }
  if (request.local_rank() >= 0 && slots_.count({request.hostname(), request.local_rank()}))
    for (const auto& w : workers_)
      if (w.host == request.hostname() && w.local_rank == request.local_rank())
        return {grpc::StatusCode::FAILED_PRECONDITION,
                "host " + w.host + " local rank " + std::to_string(w.local_rank) +
                    " already joined (pid " + std::to_string(w.pid) + ")"};

  Worker worker;
  worker.host = request.hostname();
  worker.local_rank = request.local_rank();
  worker.pid = request.pid();
  worker.peer = peer;
  worker.join_order = joins_++;
  worker.joined_at = utc_timestamp();
  worker.rank = request.has_claimed_rank() ? request.claimed_rank() : -1;
  worker.previous_generation = request.previous_generation();
  const int join_order = worker.join_order;
  add_worker_locked(std::move(worker));
  const Worker& added = workers_.back();
  // One line per join for a lab's jobs; for thousands, the first ones, then
  // every tenth of the way (a line per join would cost more than the join).
  const size_t joined = workers_.size(), every = std::max<size_t>(1, size_t(world_size_) / 10);
  if (world_size_ <= 64 || joined <= 8 || joined % every == 0)
    spdlog::info("coordinator: join {} of {}{}: {} local rank {} pid {} from {}{}", joined,
                 world_size_, generation_ > options_.generation
                     ? " for generation " + std::to_string(generation_) : "",
                 added.host, added.local_rank, added.pid, peer,
                 added.previous_generation > 0
                     ? " (the same process, back from generation " +
                           std::to_string(added.previous_generation) + ")"
                     : "");

  awaited_.erase({added.host, added.pid});
  maybe_start_locked(Clock::now());
  // This join's generation: a restart during the wait (a waiting worker's
  // process ended) keeps it; only running or ending releases the wait.
  const int64_t joined_generation = generation_;
  const auto wait_end = std::min(give_up, waiting_since_ + options_.rendezvous_timeout);
  auto started = [&] { return state_ != State::kWaiting || rendezvous_expired_locked(Clock::now()); };
  // In slices, so that a caller that went away (a worker killed while it
  // waited) is noticed and its slot freed before the job starts without it.
  // A slice grows with the number of held calls (each wakes once a slice):
  // 100 ms for a lab's jobs, up to 2 s for ten thousand workers, so that
  // the waiting costs the coordinator little more than the joining.
  bool gone = false;
  ++waiting_joins_;
  while (!started() && Clock::now() < wait_end) {
    const auto slice = std::chrono::milliseconds(std::clamp(waiting_joins_, 100, 2000));
    changed_.wait_until(lock, std::min(wait_end, Clock::now() + slice), started);
    if (!started() && caller_gone && caller_gone()) {
      gone = true;
      break;
    }
  }
  --waiting_joins_;
  // workers_ stays in join order (erasing keeps it): found by bisection.
  auto mine = std::lower_bound(workers_.begin(), workers_.end(), join_order,
                               [](const Worker& w, int order) { return w.join_order < order; });
  if (mine != workers_.end() && mine->join_order != join_order) mine = workers_.end();
  if (state_ == State::kWaiting) {
    if (rendezvous_expired_locked(Clock::now())) {
      fail_locked("rendezvous timed out after " +
                  std::to_string(options_.rendezvous_timeout.count() / 1000.0).substr(0, 5) +
                  " s: " + who_joined_locked());
    } else {  // this caller gave up or went away: take it off the list
      if (mine != workers_.end()) {
        spdlog::warn("coordinator: {} pid {} {} before the job started: its place is free again "
                     "({} of {} joined)", mine->host, mine->pid,
                     gone ? "went away (its Join was cancelled)" : "gave up waiting",
                     workers_.size() - 1, world_size_);
        erase_worker_locked(mine);
      }
      return {grpc::StatusCode::DEADLINE_EXCEEDED, "gave up waiting for the other workers"};
    }
  }
  if (standby_orders_.erase(join_order))
    return {grpc::StatusCode::UNAVAILABLE,
            "standby: generation " + std::to_string(generation_) + " of job " + options_.run_id + " started on " +
                std::to_string(world_size_) + " ranks without this worker (the largest world size the workers "
                "there fill that divides the step's microbatches); it joins when the job can grow "
                "(this worker asks again every second)"};
  if (state_ == State::kFailed) return {grpc::StatusCode::ABORTED, failure_};
  if (state_ == State::kStopped)
    return {grpc::StatusCode::ABORTED, "the job stopped before it started (" + stop_reason_ + ")"};
  if (mine == workers_.end() || generation_ != joined_generation)
    return {grpc::StatusCode::ABORTED, "generation " + std::to_string(joined_generation) +
                                           " ended before it started; join again"};
  const Worker& me = *mine;
  reply->set_rank(me.rank);
  reply->set_world_size(world_size_);
  reply->set_generation(generation_);
  reply->set_run_id(options_.run_id);
  reply->set_seed(options_.seed);
  for (const auto& s : options_.settings) reply->add_settings(s);
  for (const auto& [key, source] : options_.sources) (*reply->mutable_config_sources())[key] = source;
  reply->set_job_file(options_.job_file);
  reply->set_folder_marker(options_.folder_marker);
  reply->set_local_world_size(me.local_world_size);
  reply->set_local_rank(me.local_index);
  reply->set_resume(generation_ > options_.generation);
  return grpc::Status::OK;
}

void JobState::maybe_start_locked(Clock::time_point now) {
  if (state_ != State::kWaiting) return;
  const int joined = int(workers_.size());
  if (joined >= world_size_) {
    start_generation_locked(world_size_, "");
    return;
  }
  // The first generation waits for every worker; so does a job that is not elastic.
  if (!elastic() || generation_ == options_.generation) return;
  if (now < ended_at_ + options_.replace_wait) return;
  // The survivors of the ended generation rejoin from their processes;
  // they get until fault.heartbeat_timeout_s + 5 s to unwind before the
  // job goes on without them.
  const auto grace = options_.heartbeat_timeout + std::chrono::seconds(5);
  if (!awaited_.empty() && now < ended_at_ + grace) return;
  const int world = best_world_size(joined);
  const double waited = seconds_between(ended_at_, now);
  if (world == 0) {
    fail_locked(std::to_string(joined) + " worker(s) there after " + end_reason_ + ": " +
                (joined < options_.min_ranks
                     ? "fewer than elastic.min_ranks = " + std::to_string(options_.min_ranks)
                     : "none of the world sizes from elastic.min_ranks = " + std::to_string(options_.min_ranks) +
                           " to " + std::to_string(joined) + " divides the " + std::to_string(options_.microbatches) +
                           " microbatches of a step") +
                ", and no replacement joined within elastic.replace_wait_s = " + fmt::format("{:g}", options_.replace_wait.count() / 1000.0) +
                " s (waited " + fmt::format("{:.1f}", waited) + " s); the run folder keeps its manifest and "
                "checkpoints: resume it with --resume when enough workers are there");
    return;
  }
  start_generation_locked(world, std::to_string(joined) + " worker(s) there " + fmt::format("{:.1f}", waited) +
                                     " s after the generation ended, no replacement for the rest");
}

void JobState::start_generation_locked(int world, const std::string& why) {
  if (int(workers_.size()) > world) {
    // The survivors (their state is in memory) first, then by join order;
    // the rest wait as standbys.
    std::vector<size_t> order(workers_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return (workers_[a].previous_generation > 0) > (workers_[b].previous_generation > 0);
    });
    std::set<int> leave;
    for (size_t i = size_t(world); i < order.size(); ++i) leave.insert(workers_[order[i]].join_order);
    for (const int join_order : leave) {
      auto w = std::find_if(workers_.begin(), workers_.end(),
                            [&](const Worker& x) { return x.join_order == join_order; });
      spdlog::info("coordinator: {} pid {} waits as a standby: generation {} runs on {} ranks", w->host, w->pid,
                   generation_, world);
      standby_orders_.insert(join_order);
      erase_worker_locked(w);
    }
  }
  world_size_ = world;
  assign_ranks_locked();
  state_ = State::kRunning;
  const auto now = Clock::now();
  for (auto& w : workers_) {
    w.state = "running";
    w.last_heartbeat = now;  // the clock starts at the rendezvous
  }
  if (generation_ > options_.generation) {
    const double lost = seconds_between(ended_at_, now);
    const std::string change = running_world_size_ == world ? "the same world size"
                               : world < running_world_size_ ? "shrinks" : "grows";
    const double ended_unix_s =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() - lost;
    membership_.push_back({{"generation", generation_}, {"step", step_at_end_}, {"last_step_reported", step_at_end_},
                           {"ended_unix_s", ended_unix_s},
                           {"world_size_before", running_world_size_}, {"world_size", world},
                           {"reason", end_reason_ + (why.empty() ? "" : "; " + why)},
                           {"kind", ended_by_regroup_ ? "regroup" : "loss"},
                           {"seconds_to_new_generation", lost}, {"at", utc_timestamp()}});
    spdlog::warn("Decision: world_size = {} (generation {}, from step {}: {} ranks before, {}; {}{}; {:.1f} s from "
                 "the end of the last generation)", world, generation_, step_at_end_, running_world_size_, change,
                 end_reason_, why.empty() ? "" : "; " + why, lost);
  }
  running_world_size_ = world;
  awaited_.clear();
  spdlog::info("coordinator: all {} workers joined; generation {} of run {} starts", world, generation_,
               options_.run_id);
  changed_.notify_all();
}

grpc::Status JobState::stand_by_or_grow_locked(const v1::JoinRequest& request) {
  const auto now = Clock::now();
  standbys_[{request.hostname(), request.pid()}] = now;
  for (auto s = standbys_.begin(); s != standbys_.end();)  // those that stopped asking are gone
    s = now - s->second > std::chrono::seconds(5) ? standbys_.erase(s) : std::next(s);
  const int grown = best_world_size(world_size_ + int(standbys_.size()));
  if (grown > world_size_) {
    regroup_locked(std::to_string(standbys_.size()) + " worker(s) wait to join (the last " + request.hostname() +
                       " pid " + std::to_string(request.pid()) + "): growing from " + std::to_string(world_size_) +
                       " to " + std::to_string(grown) + " ranks",
                   grown);
    standbys_.clear();
    return grpc::Status::OK;  // this one joins the forming generation now; the others at their next ask
  }
  int needed = 0;
  for (int w = world_size_ + 1; w <= options_.world_size && needed == 0; ++w)
    if (options_.microbatches <= 0 || options_.microbatches % w == 0) needed = w - world_size_ - int(standbys_.size());
  return {grpc::StatusCode::UNAVAILABLE,
          "standby: job " + options_.run_id + " runs on " + std::to_string(world_size_) + " of at most " +
              std::to_string(options_.world_size) + " ranks" +
              (needed > 0 ? "; it grows when " + std::to_string(needed) + " more worker(s) wait to join"
                          : "; it cannot grow further") +
              " (this worker asks again every second)"};
}

}  // namespace lockstep

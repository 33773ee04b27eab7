#include "coordinator/job_state.h"

#include <algorithm>
#include <ctime>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "runtime/run/run_folder.h"
#include "runtime/base/untrusted_json.h"

namespace lockstep {
namespace {

// The audits a heartbeat carries, parsed within bounds; INVALID_ARGUMENT
// naming the field when one is not an audit.
grpc::Status parse_audits(const v1::HeartbeatRequest& request, std::vector<nlohmann::json>* audits) {
  for (int i = 0; i < request.audits_json_size(); ++i) {
    std::string why;
    auto audit = parse_untrusted_json(request.audits_json(i), &why);
    if (!audit.is_discarded() &&
        (!audit.is_object() || !audit.contains("step") || !audit["step"].is_number_integer() ||
         (audit.contains("agreed") && !audit["agreed"].is_boolean()) ||
         (audit.contains("verdict") && !audit["verdict"].is_string())))
      why = "not an audit (an object with an integer step, boolean agreed, string verdict)";
    if (!why.empty())
      return {grpc::StatusCode::INVALID_ARGUMENT,
              "rank " + std::to_string(request.rank()) + ": heartbeat audits_json[" + std::to_string(i) +
                  "]: " + why};
    audits->push_back(std::move(audit));
  }
  return grpc::Status::OK;
}

}  // namespace

double JobState::seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

JobState::JobState(JobStateOptions options)
    : options_(std::move(options)), generation_(options_.generation), waiting_since_(created_),
      world_size_(options_.world_size) {}

int JobState::best_world_size(int workers) const {
  const int least = elastic() ? options_.min_ranks : options_.world_size;
  for (int w = std::min(workers, options_.world_size); w >= least && w >= 1; --w)
    if (options_.microbatches <= 0 || options_.microbatches % w == 0) return w;
  return 0;
}

bool JobState::from_ended_generation_locked(const std::string& run_id, int64_t generation) const {
  return run_id == options_.run_id && generation >= options_.generation && generation < generation_;
}

void JobState::add_worker_locked(Worker worker) {
  if (worker.local_rank >= 0) ++slots_[{worker.host, worker.local_rank}];
  if (worker.rank >= 0) claimed_ranks_.insert(worker.rank);
  workers_.push_back(std::move(worker));
}

void JobState::erase_worker_locked(std::vector<Worker>::iterator w) {
  if (w->local_rank >= 0) {
    auto slot = slots_.find({w->host, w->local_rank});
    if (slot != slots_.end() && --slot->second == 0) slots_.erase(slot);
  }
  claimed_ranks_.erase(w->rank);
  workers_.erase(w);
  index_of_rank_.clear();  // ranks are assigned again when the job is full
}

void JobState::clear_workers_locked() {
  workers_.clear();
  index_of_rank_.clear();
  slots_.clear();
  claimed_ranks_.clear();
}

bool JobState::rendezvous_expired_locked(Clock::time_point now) const {
  return state_ == State::kWaiting && now >= waiting_since_ + options_.rendezvous_timeout;
}

const char* JobState::state_name(State state) {
  switch (state) {
    case State::kWaiting: return "waiting";
    case State::kRunning: return "running";
    case State::kCompleted: return "completed";
    case State::kFailed: return "failed";
    case State::kStopped: return "stopped";
  }
  return "?";
}

std::string JobState::who_joined_locked() const {
  if (workers_.empty()) return "nobody joined";
  std::string out;
  for (size_t i = 0; i < workers_.size() && i < 16; ++i) {
    const Worker& w = workers_[i];
    out += (out.empty() ? "" : ", ") + w.host + " (pid " + std::to_string(w.pid) + ", local rank " +
           std::to_string(w.local_rank) + ", from " + w.peer + ")";
  }
  if (workers_.size() > 16) out += ", ... (" + std::to_string(workers_.size() - 16) + " more)";
  return std::to_string(workers_.size()) + " of " + std::to_string(options_.world_size) +
         " joined: " + out;
}

JobState::Worker* JobState::find_locked(const std::string& run_id, int rank, int64_t generation,
                                        grpc::Status* error) {
  if (run_id != options_.run_id) {
    *error = {grpc::StatusCode::NOT_FOUND, "unknown run id '" + run_id + "'"};
    return nullptr;
  }
  if (generation == generation_ && state_ != State::kWaiting && rank >= 0 &&
      size_t(rank) < index_of_rank_.size())
    return &workers_[index_of_rank_[size_t(rank)]];
  *error = {grpc::StatusCode::NOT_FOUND, "no rank " + std::to_string(rank) + " in generation " +
                                             std::to_string(generation) + " of run " + run_id};
  return nullptr;
}

grpc::Status JobState::heartbeat(const v1::HeartbeatRequest& request, v1::HeartbeatReply* reply) {
  // What the worker sent is checked before it touches the job's state.
  std::vector<nlohmann::json> audits;
  if (auto refused = parse_audits(request, &audits); !refused.ok()) return refused;
  std::lock_guard<std::mutex> lock(mutex_);
  if (from_ended_generation_locked(request.run_id(), request.generation())) {
    if (auto lost = lost_ranks_.find({request.generation(), request.rank()}); lost != lost_ranks_.end()) {
      reply->set_command(v1::HeartbeatReply::ABORT);
      reply->set_reason("this rank was declared lost in generation " + std::to_string(request.generation()) +
                        " (" + lost->second + ") and the job went on without it; a process that comes "
                        "back is not merged: start a new worker to rejoin");
    } else if (state_ == State::kFailed) {
      reply->set_command(v1::HeartbeatReply::ABORT);
      reply->set_reason(failure_);
    } else {
      // A regroup ends the generation after a step the ranks agree on; a
      // loss, at once (the collective with the lost rank cannot finish).
      const bool regroup = ended_by_regroup_ && request.generation() == generation_ - 1;
      reply->set_command(regroup ? v1::HeartbeatReply::REGROUP : v1::HeartbeatReply::REJOIN);
      reply->set_reason("generation " + std::to_string(request.generation()) + " ended (" + end_reason_ +
                        "); join generation " + std::to_string(generation_));
    }
    return grpc::Status::OK;
  }
  grpc::Status error;
  Worker* w = find_locked(request.run_id(), request.rank(), request.generation(), &error);
  if (!w) return error;
  const auto now = Clock::now();
  const double gap = seconds_between(w->last_heartbeat, now);
  const double period = options_.heartbeat_period.count() / 1000.0;
  w->max_heartbeat_gap_s = std::max(w->max_heartbeat_gap_s, gap);
  if (w->heartbeat_seen && period > 0 && gap > 1.5 * period) w->heartbeats_missed += int64_t(gap / period) - 1;
  w->last_heartbeat = now;
  w->heartbeat_seen = true;
  ++w->heartbeats;
  w->step = request.step();
  w->loss = request.loss();
  w->samples_per_s = request.samples_per_s();
  w->phase = request.phase();
  w->audit = request.audit();
  if (!request.eval().empty()) last_eval_ = request.eval().substr(0, 1000);
  files_skipped_before_training_ = std::max(files_skipped_before_training_, request.files_skipped_before_training());
  w->files_skipped_in_batches = request.files_skipped_in_batches();
  w->total_steps = request.total_steps();
  w->skipped_steps = request.skipped_steps();
  if (w->pace_from_step < 0 && request.step() > 0) {
    w->pace_from_step = request.step();
    w->pace_from = now;
  }
  record_audits_locked(request.rank(), audits);
  if (state_ == State::kFailed) {
    reply->set_command(v1::HeartbeatReply::ABORT);
    reply->set_reason(failure_);
    w->told_to_abort = true;
    changed_.notify_all();
  } else if (!stop_reason_.empty()) {
    reply->set_command(v1::HeartbeatReply::STOP);
    reply->set_reason(stop_reason_);
  } else {
    reply->set_command(v1::HeartbeatReply::CONTINUE);
  }
  return grpc::Status::OK;
}

grpc::Status JobState::report(const v1::ReportRequest& request) {
  std::string why;
  nlohmann::json metrics =
      parse_untrusted_json(request.metrics_json().empty() ? "{}" : request.metrics_json(), &why);
  if (!metrics.is_discarded() && !metrics.is_object()) why = "not a JSON object";
  if (!why.empty())
    return {grpc::StatusCode::INVALID_ARGUMENT,
            "rank " + std::to_string(request.rank()) + ": report metrics_json: " + why};
  std::lock_guard<std::mutex> lock(mutex_);
  if (from_ended_generation_locked(request.run_id(), request.generation())) {
    // A regroup asked for on the last step: the ranks finished the job
    // before they could stop for it. The job is done; nothing regroups.
    if (ended_by_regroup_ && request.generation() == generation_ - 1 && request.success() &&
        request.stopped_at_step() == 0 && state_ == State::kWaiting) {
      state_ = State::kCompleted;
      spdlog::info("coordinator: rank {} of generation {} finished the job before the regroup: run {} completed",
                   request.rank(), request.generation(), options_.run_id);
      changed_.notify_all();
    }
    return grpc::Status::OK;  // that generation is over; its restart is already counted
  }
  grpc::Status error;
  Worker* w = find_locked(request.run_id(), request.rank(), request.generation(), &error);
  if (!w) return error;
  if (!request.success() && !request.exclude_host().empty()) {
    // Only a host of this job, named by one of its ranks: checked before it counts.
    const bool ours = std::any_of(workers_.begin(), workers_.end(),
                                  [&](const Worker& x) { return x.host == request.exclude_host(); });
    if (!ours || request.exclude_host().size() > 255)
      return {grpc::StatusCode::INVALID_ARGUMENT,
              "rank " + std::to_string(request.rank()) + ": exclude_host names no host of this generation"};
    if (state_ == State::kRunning) exclude_host_locked(request.exclude_host(), request.error(), w->rank);
    return grpc::Status::OK;
  }
  w->metrics = std::move(metrics);
  if (request.success() && request.stopped_at_step() > 0) {
    if (stop_reason_.empty())  // the ranks agreed among themselves
      stop_reason_ = "a rank asked (SIGUSR1 to a worker)";
    w->state = "stopped";
    w->step = request.stopped_at_step();
    spdlog::info("coordinator: rank {} stopped after step {}", w->rank, w->step);
  } else if (request.success()) {
    w->state = "finished";
    spdlog::info("coordinator: rank {} finished", w->rank);
  } else {
    w->state = "failed";
    // The first line is the failure (a model's: phase, step, precision and
    // its error); lines after it, a traceback, are printed once per job.
    const std::string& raw = request.error();
    const std::string error = raw.substr(std::min(raw.find_first_not_of("\n "), raw.size()));
    w->error = error.substr(0, std::min(error.find('\n'), size_t(4000)));
    const auto same = std::find_if(workers_.begin(), workers_.end(), [&](const Worker& x) {
      return &x != w && x.state == "failed" && x.error == w->error;
    });
    if (same != workers_.end()) {
      spdlog::error("coordinator: rank {} ({}) failed: the same as rank {}", w->rank, w->host, same->rank);
    } else {
      spdlog::error("coordinator: rank {} ({}) failed: {}", w->rank, w->host, w->error);
      if (error.size() > w->error.size() + 1)
        spdlog::error("coordinator: rank {}'s whole message (also in failure-rank{}.log in its run folder):\n{}",
                      w->rank, w->rank, error.substr(w->error.size() + 1, 16000));
    }
    const std::string verdict = "rank " + std::to_string(w->rank) + " (" + w->host + ") failed at step " +
                                std::to_string(w->step) + ": " + w->error;
    if (state_ == State::kRunning) {
      fail_locked(verdict);
      failure_from_lost_peer_ = request.peer_may_be_lost();
    } else if (state_ == State::kFailed && failure_from_lost_peer_ && !request.peer_may_be_lost()) {
      // The first report only lost its peer (a closed connection); this rank
      // has an error of its own: the root cause, named in the verdict.
      spdlog::error("coordinator: the root cause is rank {}'s own error; rank(s) reported before it only "
                    "lost their peer", w->rank);
      failure_ = verdict + " (before it, " + failure_ + ")";
      failure_from_lost_peer_ = false;
    }
  }
  const bool all_reported = std::all_of(workers_.begin(), workers_.end(), [](const Worker& x) {
    return x.state == "finished" || x.state == "stopped";
  });
  if (state_ == State::kRunning && all_reported) {
    const auto stopped = std::find_if(workers_.begin(), workers_.end(),
                                      [](const Worker& x) { return x.state == "stopped"; });
    if (stopped == workers_.end()) {
      state_ = State::kCompleted;
      spdlog::info("coordinator: every rank finished: run {} completed", options_.run_id);
    } else {
      state_ = State::kStopped;
      stopped_at_step_ = stopped->step;
      spdlog::warn("coordinator: every rank stopped after step {} ({}): run {} stopped, to be "
                   "resumed with --resume", stopped_at_step_, stop_reason_, options_.run_id);
    }
  }
  changed_.notify_all();
  return grpc::Status::OK;
}

void JobState::record_audits_locked(int rank, std::vector<nlohmann::json>& audits) {
  for (auto& audit : audits) {
    const int64_t step = audit["step"];
    if (!audited_steps_.insert(step).second) continue;  // every rank sends the same verdict
    last_audit_ = "step " + std::to_string(step) + ": " + audit.value("verdict", "?");
    ++audits_;
    if (!audit.value("agreed", true)) {
      ++drifted_audits_;
      if (first_drift_step_ < 0 || step < first_drift_step_) first_drift_step_ = step;
    }
    if (!audit.value("agreed", true))
      spdlog::error("coordinator: audit at step {} found drift: {}", step, audit.value("verdict", "?"));
    if (options_.audit_log.empty()) continue;
    if (!audit_log_) {
      std::error_code ignored;
      std::filesystem::create_directories(std::filesystem::path(options_.audit_log).parent_path(), ignored);
      audit_log_ = std::make_unique<EventWriter>(options_.audit_log);
    }
    audit["reported_by_rank"] = rank;
    try {
      audit_log_->write(audit);
    } catch (const std::exception& e) {  // the job goes on; its record has a gap, said once
      if (!audit_log_failed_) spdlog::error("coordinator: {} (later audits are not recorded there)", e.what());
      audit_log_failed_ = true;
    }
  }
}

bool JobState::ended_locked() const {
  return state_ == State::kCompleted || state_ == State::kFailed || state_ == State::kStopped;
}

void JobState::request_stop(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ended_locked() || !stop_reason_.empty()) return;
  stop_reason_ = reason;
  if (state_ == State::kWaiting) {
    state_ = State::kStopped;
    spdlog::warn("Decision: stop = now ({}; no rank trained yet: nothing to checkpoint)", reason);
  } else {
    spdlog::warn("Decision: stop = after a step every rank agrees on, with a checkpoint there "
                 "({}; the ranks hear it with their next heartbeat)", reason);
  }
  changed_.notify_all();
}

int64_t JobState::stopped_at_step() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopped_at_step_;
}

void JobState::fail_locked(const std::string& reason) {
  if (ended_locked()) return;
  state_ = State::kFailed;
  failure_ = reason;
  spdlog::error("coordinator: job failed: {}", reason);
  changed_.notify_all();
}

void JobState::cancel(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ended_locked()) return;
  cancelled_ = true;
  fail_locked("cancelled: " + reason);
}

void JobState::fail(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  fail_locked(reason);
}

bool JobState::wait_until_ended(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] {
    return ended_locked();
  });
}

void JobState::wait_until_told(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, timeout, [&] {
    return std::all_of(workers_.begin(), workers_.end(), [](const Worker& w) {
      return w.told_to_abort || w.state != "running";
    });
  });
}

}  // namespace lockstep

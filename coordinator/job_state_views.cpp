// What the job's state says to those outside it: its outcome, its drift,
// the status reply (lockstep status, the metrics endpoint) and the JSON the
// coordinator writes into manifest.json.
#include "coordinator/job_state.h"

#include <algorithm>

namespace lockstep {

int64_t JobState::first_drift_step() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return first_drift_step_;
}

std::string JobState::drift_summary() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (first_drift_step_ < 0) return "";
  return "the ranks disagreed at " + std::to_string(drifted_audits_) + " of " + std::to_string(audits_) +
         " audits, first at step " + std::to_string(first_drift_step_);
}

bool JobState::cancelled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cancelled_;
}

JobState::State JobState::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_;
}

std::string JobState::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

std::string JobState::rank_state_locked(const Worker& w) const {
  // Once the job has ended without this rank's own word, "running" would
  // be false: say what the coordinator last knew of it.
  if (w.state == "running" && (state_ == State::kFailed || state_ == State::kStopped || state_ == State::kCompleted))
    return w.told_to_abort ? "aborted" : "lost";
  return w.state;
}

nlohmann::json JobState::workers_json_locked() const {
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& w : workers_) {
    const std::string state = rank_state_locked(w);
    workers.push_back({{"rank", w.rank}, {"host", w.host}, {"local_rank", w.local_rank},
                       {"pid", w.pid}, {"peer", w.peer}, {"joined_at", w.joined_at},
                       {"join_order", w.join_order}, {"state", state},
                       {"heartbeats", w.heartbeats},
                       {"max_heartbeat_gap_s", w.max_heartbeat_gap_s},
                       {"heartbeats_missed", w.heartbeats_missed},
                       {"last_step", w.step}, {"error", w.error},
                       {"back_from_generation", w.previous_generation},
                       {"scaler_skipped", w.metrics.is_object() && w.metrics.contains("scaler") &&
                                                  w.metrics["scaler"].is_object()
                                              ? w.metrics["scaler"].value("skipped", int64_t(0))
                                              : int64_t(0)}});
  }
  return workers;
}

nlohmann::json JobState::to_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {{"state", state_name(state_)}, {"failure", failure_}, {"generation", generation_},
          {"world_size", running_world_size_ > 0 ? running_world_size_ : world_size_},
          {"world_size_max", options_.world_size},
          {"elastic", elastic() ? nlohmann::json{{"min_ranks", options_.min_ranks},
                                                 {"max_ranks", options_.world_size},
                                                 {"replace_wait_s", options_.replace_wait.count() / 1000.0},
                                                 {"max_host_losses", options_.max_host_losses}}
                                : nlohmann::json(nullptr)},
          {"membership", membership_}, {"host_losses", host_losses_},
          {"workers", workers_json_locked()},
          {"restarts", restarts_}, {"max_restarts", options_.max_restarts},
          {"earlier_generations", earlier_generations_}, {"stop_reason", stop_reason_},
          {"stopped_at_step", stopped_at_step_}, {"first_drift_step", first_drift_step_},
          {"drifted_audits", drifted_audits_}, {"audits", audits_}};
}

void JobState::status(v1::StatusReply* reply) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  reply->set_run_id(options_.run_id);
  reply->set_state(state_ == State::kCompleted && first_drift_step_ >= 0 ? "completed_with_drift"
                                                                       : state_name(state_));
  reply->set_world_size(world_size_);
  reply->set_generation(generation_);
  reply->set_failure(failure_);
  reply->set_joined(int(workers_.size()));
  reply->set_last_audit(last_audit_);
  reply->set_last_eval(last_eval_);
  int64_t skipped = files_skipped_before_training_;
  for (const auto& w : workers_) skipped += w.files_skipped_in_batches;
  reply->set_bad_files_skipped(skipped);
  reply->set_audits(audits_);
  reply->set_audit_disagreements(drifted_audits_);
  reply->set_first_drift_step(first_drift_step_);
  // ETA: the slowest rank at its own pace since its first step was heard of.
  int64_t total = 0, skipped_steps = 0;
  double eta = -1;
  for (const auto& w : workers_) {
    total = std::max(total, w.total_steps);
    skipped_steps = std::max(skipped_steps, w.skipped_steps);
    const double seconds = seconds_between(w.pace_from, now);
    if (w.total_steps > 0 && w.pace_from_step >= 0 && w.step > w.pace_from_step && seconds > 0)
      eta = std::max(eta, double(w.total_steps - w.step) * seconds / double(w.step - w.pace_from_step));
  }
  reply->set_total_steps(total);
  reply->set_skipped_steps(skipped_steps);
  reply->set_eta_s(state_ == State::kRunning ? eta : -1);
  reply->set_restarts(int(restarts_.size()));
  reply->set_max_restarts(options_.max_restarts);
  std::vector<const Worker*> by_rank;
  for (const auto& w : workers_) by_rank.push_back(&w);
  std::sort(by_rank.begin(), by_rank.end(),
            [](const Worker* a, const Worker* b) { return a->rank < b->rank; });
  for (const Worker* w : by_rank) {
    auto* row = reply->add_ranks();
    row->set_rank(w->rank);
    row->set_host(w->host);
    row->set_pid(w->pid);
    row->set_step(w->step);
    row->set_loss(w->loss);
    row->set_samples_per_s(w->samples_per_s);
    row->set_heartbeat_age_s(w->heartbeat_seen ? seconds_between(w->last_heartbeat, now) : -1.0);
    row->set_state(rank_state_locked(*w));
    row->set_phase(w->phase);
    row->set_audit(w->audit);
    row->set_skipped_steps(w->skipped_steps);
  }
}

}  // namespace lockstep

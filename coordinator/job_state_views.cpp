// What the job's state says to those outside it: its outcome, its drift,
// and the JSON the coordinator writes into manifest.json.
#include "coordinator/job_state.h"

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

nlohmann::json JobState::workers_json_locked() const {
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& w : workers_)
    workers.push_back({{"rank", w.rank}, {"host", w.host}, {"local_rank", w.local_rank},
                       {"pid", w.pid}, {"peer", w.peer}, {"joined_at", w.joined_at},
                       {"join_order", w.join_order}, {"state", w.state},
                       {"heartbeats", w.heartbeats},
                       {"max_heartbeat_gap_s", w.max_heartbeat_gap_s},
                       {"heartbeats_missed", w.heartbeats_missed},
                       {"last_step", w.step}, {"error", w.error},
                       {"back_from_generation", w.previous_generation},
                       {"scaler_skipped", w.metrics.is_object() && w.metrics.contains("scaler") &&
                                                  w.metrics["scaler"].is_object()
                                              ? w.metrics["scaler"].value("skipped", int64_t(0))
                                              : int64_t(0)}});
  return workers;
}

nlohmann::json JobState::to_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {{"state", state_name(state_)}, {"failure", failure_}, {"generation", generation_},
          {"world_size", options_.world_size}, {"workers", workers_json_locked()},
          {"restarts", restarts_}, {"max_restarts", options_.max_restarts},
          {"earlier_generations", earlier_generations_}, {"stop_reason", stop_reason_},
          {"stopped_at_step", stopped_at_step_}, {"first_drift_step", first_drift_step_},
          {"drifted_audits", drifted_audits_}, {"audits", audits_}};
}

}  // namespace lockstep

#pragma once
// Live metrics for a scraper: the coordinator's status (the same figures as
// `lockstep status --json`) in Prometheus's text format (version 0.0.4) at
// GET /metrics on its own HTTP port, read-only, one short connection per
// request, each answered within 2 s of its accept; a slow client holds up
// no other. Series (labels: run, and rank where per rank):
//   lockstep_up{state}                 1 for the job's current state
//   lockstep_world_size, lockstep_joined_workers, lockstep_generation,
//   lockstep_restarts_total, lockstep_audits_total,
//   lockstep_audit_disagreements_total, lockstep_first_drift_step (-1: none),
//   lockstep_bad_files_skipped_total, lockstep_skipped_steps_total
//   lockstep_rank_step, lockstep_rank_loss, lockstep_rank_samples_per_second,
//   lockstep_rank_heartbeat_age_seconds
#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "lockstep/proto/lockstep.pb.h"

namespace lockstep {

std::string prometheus_text(const v1::StatusReply& status);

class MetricsEndpoint {
 public:
  // Listens on `host_port` (port 0: any free port). Throws InputError for an
  // address that cannot be bound, naming it.
  MetricsEndpoint(const std::string& host_port, std::function<v1::StatusReply()> status);
  ~MetricsEndpoint();  // stops serving
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;
  int port() const { return port_; }

 private:
  void serve();
  std::string answer(const std::string& request) const;  // the whole HTTP response

  std::function<v1::StatusReply()> status_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace lockstep

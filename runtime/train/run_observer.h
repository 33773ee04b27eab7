#pragma once
// Who else wants to know how a rank's run goes: the coordinator's heartbeat
// loop, for one. Calls come from the training thread; an implementation
// must return quickly and be safe against its own threads.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep {

class RunObserver {
 public:
  virtual ~RunObserver() = default;
  // startup | train | eval | done
  virtual void on_phase(const std::string& phase) { (void)phase; }
  // After every optimizer step (1-based), with the recent mean training
  // loss over the global batch and the global samples per second.
  virtual void on_step(int64_t step, double loss, double samples_per_s) {
    (void)step, (void)loss, (void)samples_per_s;
  }
  // Once training starts: the optimizer steps this run ends at.
  virtual void on_total_steps(int64_t total) { (void)total; }
  // After every evaluation: "step N: test loss ..., accuracy ..." (the same on every rank).
  virtual void on_eval(const std::string& summary) { (void)summary; }
  // Files left out under data.bad_files = skip: before training (the same
  // on every rank) and while this rank assembled its batches. At the start
  // and whenever the count grows.
  virtual void on_skipped_files(int64_t before_training, int64_t in_batches) {
    (void)before_training, (void)in_batches;
  }
  // Optimizer steps that trained nothing so far (the gradient scaler found
  // inf/NaN, or no rank had a valid target): whenever the count grows.
  virtual void on_skipped_steps(int64_t total) { (void)total; }
  // After every audit, with its summary (AuditResult::to_json()).
  virtual void on_audit(const nlohmann::json& summary) { (void)summary; }
  // True once the run should end cleanly after the current step.
  virtual bool stop_requested() { return false; }
  // True when that stop is an elastic job's regroup: the run goes on in a
  // new generation from the state this rank keeps in memory.
  virtual bool regroup_requested() { return false; }
};

}  // namespace lockstep

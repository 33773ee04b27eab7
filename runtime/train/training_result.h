#pragma once
// What one rank's training comes to: its figures for the manifest, the
// events and the coordinator, and the run's length in steps.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/job/config.h"
#include "runtime/train/evaluate.h"

namespace lockstep {

struct TrainingResult {
  int64_t steps = 0;             // optimizer steps taken or skipped
  int64_t samples = 0;           // valid samples seen, all ranks
  double final_loss = 0.0;       // this rank's last logged mean training loss
  EvalResult last_eval;          // the test set, at the end
  EvalResult last_validation;    // data.validation, the latest (samples 0: none)
  int64_t masked_targets = 0;    // this rank's samples without a target
  int64_t skipped_steps = 0;     // steps whose global batch had no valid target
  int64_t clipped_steps = 0;
  int64_t checkpoints = 0;       // checkpoints written
  int64_t last_checkpoint = 0;   // the step of the newest
  int64_t audits = 0;
  int64_t audits_disagreeing = 0;
  int64_t cross_checks = 0;  // steps whose microbatches were recomputed by other ranks (audit.verify_every)
  int64_t miscomputes = 0;   // microbatches whose recomputation differed
  double step_evidence_s = 0;  // spent digesting each microbatch's gradient and each step's state
  std::string last_audit;        // verdict of the last audit
  nlohmann::json scaler;         // the gradient scaler's figures (null: no scaler)
  int64_t overflows = 0;         // forwards in which precision.check_overflow found inf/NaN
  double step_s_median = 0;      // median wall time of a step, after 10 warm-up steps
  double allreduce_hidden_share = 0;  // gradient bytes all-reduced before backward ended
  int64_t summation_regrids = 0;      // exact summation: steps summed a second time on a new grid
  double allreduce_bytes_per_step = 0;  // gradient all-reduce payload per step (GradientReducer::bytes_reduced)
  int64_t stopped_at_step = 0;   // > 0: stopped there on request (RunObserver::stop_requested), not the end
  std::vector<std::vector<std::string>> shared_gradients;  // from the clip check
  std::string eval_summary;      // the last evaluation, for the log
  nlohmann::json to_json() const;
};

// Total optimizer steps for the job (job.steps, or job.epochs worth).
int64_t total_steps(const JobConfig& config, int64_t steps_per_epoch);

}  // namespace lockstep

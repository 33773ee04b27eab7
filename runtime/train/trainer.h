#pragma once
// The training loop of one rank (step 4 of the data flow): microbatches ->
// forward -> masked loss -> backward -> bucketed all-reduce (mean over the
// global batch) -> clip -> optimizer step, with evaluation every eval.every
// steps and at the end. Stops with RunError naming the step and rank on a
// non-finite loss or gradient. Every rank must call run() together.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/audit/audit.h"
#include "runtime/checkpoint/checkpoint_store.h"
#include "runtime/comm/control_group.h"
#include "runtime/job/config.h"
#include "runtime/data/batches.h"
#include "runtime/run/decisions.h"
#include "runtime/model/model.h"
#include "runtime/run/run_folder.h"
#include "runtime/train/evaluate.h"
#include "runtime/train/phase_timer.h"
#include "runtime/train/run_observer.h"

namespace lockstep {

// What the trainer works with; everything is owned by the caller.
struct TrainerParts {
  const JobConfig& config;
  int rank = 0;
  int world_size = 1;
  std::shared_ptr<Model> model;
  const TrainTestData& data;
  CollectiveGroup& data_group;
  DecisionLog& decisions;
  PhaseTimer& timer;
  EventWriter& events;
  bool terminal = false;  // rank 0 redraws a progress line in place
  RunObserver* observer = nullptr;  // may be null
  Auditor* auditor = nullptr;       // may be null: no audits
  ControlGroup* control = nullptr;  // may be null: no checkpoints
  std::string checkpoint_dir;       // RUN_DIR/checkpoints ("" = none)
  const FoundCheckpoint* resume = nullptr;  // continue from this checkpoint (in checkpoint_dir)
  int64_t* steps_done = nullptr;    // may be null; kept current, so a failure can say how far it got
  std::string precision = "fp32";   // resolved: fp32 | bf16 (autocast) | fp16 (CUDA only)
  std::string eval_precision = "fp32";  // evaluation's: the training precision, or fp32 where the dry run needed it
};

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
  std::string last_audit;        // verdict of the last audit
  nlohmann::json scaler;         // the gradient scaler's figures (null: no scaler)
  int64_t overflows = 0;         // forwards in which precision.check_overflow found inf/NaN
  double step_s_median = 0;      // median wall time of a step, after 10 warm-up steps
  double allreduce_hidden_share = 0;  // gradient bytes all-reduced before backward ended
  int64_t stopped_at_step = 0;   // > 0: stopped there on request (RunObserver::stop_requested), not the end
  std::vector<std::vector<std::string>> shared_gradients;  // from the clip check
  std::string eval_summary;      // the last evaluation, for the log
  nlohmann::json to_json() const;
};

// Total optimizer steps for the job (job.steps, or job.epochs worth).
int64_t total_steps(const JobConfig& config, int64_t batches_per_epoch);

TrainingResult train(TrainerParts parts);


}  // namespace lockstep

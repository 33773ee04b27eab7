#pragma once
// The training loop of one rank (step 4 of the data flow): microbatches ->
// forward -> masked loss -> backward -> bucketed all-reduce (mean over the
// global batch) -> clip -> optimizer step, with evaluation every eval.every
// steps and at the end. Stops with RunError naming the step and rank on a
// non-finite loss or gradient. Every rank must call run() together.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/audit/audit.h"
#include "runtime/audit/step_evidence.h"
#include "runtime/checkpoint/state_in_memory.h"
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
#include "runtime/train/training_result.h"

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
  const StateInMemory* resume_in_memory = nullptr;  // or from this state (an elastic job's new generation)
  // May be null. When a step fails (a lost peer, the generation ended), the
  // state after the last completed step goes here on the way out.
  std::optional<StateInMemory>* keep_state = nullptr;
  int64_t* steps_done = nullptr;    // may be null; kept current, so a failure can say how far it got
  std::string precision = "fp32";   // resolved: fp32 | bf16 (autocast) | fp16 (CUDA only)
  std::string eval_precision = "fp32";  // evaluation's: the training precision, or fp32 where the dry run needed it
  // May be null. Told of every microbatch's gradient digest and every
  // step's end: the run's step evidence, or a replay's check of it (which
  // also says where the run stops: StepEvidence::last_step).
  StepEvidence* evidence = nullptr;
  std::vector<std::string> hosts;   // each rank's host, for the cross-checks' messages
};

TrainingResult train(TrainerParts parts);

}  // namespace lockstep

#pragma once
// The training loop of one rank, as a class: trainer.cpp builds it and runs
// the steps; step_checks.cpp holds what checks the arithmetic (the step
// evidence, the cross-checks). Internal to runtime/train: train() in
// trainer.h is the contract.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "runtime/audit/cross_check.h"
#include "runtime/checkpoint/checkpoint_store.h"
#include "runtime/comm/reducer.h"
#include "runtime/data/augment.h"
#include "runtime/data/batches.h"
#include "runtime/loss/objective.h"
#include "runtime/train/buffer_policy.h"
#include "runtime/train/device_feed.h"
#include "runtime/train/fault_hooks.h"
#include "runtime/train/progress.h"
#include "runtime/train/trainer.h"

namespace lockstep::train_internal {

// One rank's run of the job: the parts it was given, the components built
// from the configuration (objective, reducer, optimizer, scaler, buffer
// policy, fault hooks), and the loop in run().
class StepLoop {
 public:
  explicit StepLoop(TrainerParts& parts);
  TrainingResult run();
  TrainingResult run_steps();

 private:
  // The step's microbatches: forward, loss, backward; the last backward's
  // buckets go out as they fill. Returns the global count of valid targets.
  double accumulate_gradients(int64_t step);
  // Scaler verdict, clipping, the optimizer step. False: no update (skipped).
  bool update(int64_t step, double global_valid);
  void log_step(int64_t step, double lr, double global_valid, double seconds);
  // The validation set when there is one, else the test set; `final`: the test set.
  void evaluate_now(int64_t step, bool final = false);
  // Runs `call` (the model's forward, loss or backward): what it raises
  // becomes a ModelFailure naming `phase`, the step and the precision.
  void model_call(const char* phase, int64_t step, const std::function<void()>& call);
  void start_audit(int64_t done);
  void finish_audit();
  void checkpoint_after(int64_t done, double lr);
  // What a checkpoint's index (or a state kept in memory) says besides the tensors.
  nlohmann::json state_meta(double lr, int64_t microbatches_done, int64_t epoch) const;
  // A checkpoint or a state in memory to continue from, loaded: the step, the data position.
  void resume_from(const nlohmann::json& meta, int64_t step, const std::string& from);
  // Into parts_.keep_state (when asked for): the state after the last
  // finished step, buffers as that step left them.
  void keep_state_at_boundary();
  void set_up_cross_checks();
  // The microbatch a cross-check has this rank compute again, compared with
  // its owner's on every rank; audit.on_miscompute says what a mismatch does.
  std::vector<Miscompute> cross_check(int64_t step, const MicrobatchDigest& own,
                                      const std::vector<at::Tensor>& own_gradients);
  void act_on_miscompute(const std::vector<Miscompute>& found);
  // Digest of the parameters (their flat buffer) and every buffer.
  StateDigest state_digest() const;
  bool replaying() const { return parts_.evidence && parts_.evidence->last_step() > 0; }
  // Says where the resumed checkpoint was written and where it continues.
  void record_checkpoint_device(const std::string& written_on);
  TrainingResult finish();
  TrainingResult stopped();

  TrainerParts& parts_;
  const JobConfig& config_;
  Model& model_;
  TrainingResult result_;
  NamedTensors parameters_;
  std::unique_ptr<Objective> objective_;
  std::map<std::string, std::pair<int64_t, EvalResult>> previous_evals_;  // by split: the last step and figures
  int noise_said_ = 0;
  GradientReducer reducer_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  CheckpointStore checkpoints_;
  int64_t first_step_ = 0, microbatches_done_ = 0, last_epoch_ = 0;
  // The last step boundary (after an update, or the start): what a state
  // kept in memory on the way out of a failed step describes.
  int64_t boundary_step_ = 0, boundary_microbatches_ = 0, boundary_epoch_ = 0;
  double boundary_lr_ = 0;
  const int64_t microbatches_per_step_ = microbatches_per_step(config_);  // k, all ranks
  int64_t skipped_reported_ = -1;  // rows skipped in batches, as last told to the observer
  int64_t log_every_ = 1;          // job.log_every, or about a tenth of a short run
  std::optional<Augmenter> augmenter_;  // before batches_: the stream uses it
  std::optional<BatchStream> batches_;
  std::optional<DeviceFeed> feed_;  // batches_ on device_
  int64_t steps_ = 0;
  optim::ScheduleSpec schedule_;
  at::ScalarType autocast_ = at::kFloat;
  c10::Device device_ = c10::kCPU;  // the model's: batches follow it
  std::optional<optim::GradScaler> scaler_;
  std::optional<FaultHooks> faults_;
  std::optional<BufferPolicy> buffers_;
  std::optional<ProgressPrinter> progress_;
  std::optional<CrossChecker> checker_;  // audit.verify_every
  bool checkpoints_on_ = false;
  bool reported_sharing_ = false;
  double window_loss_ = 0, window_samples_ = 0, window_seconds_ = 0;
  int64_t window_steps_ = 0;
  std::vector<double> step_times_;  // after warm-up, for the median
};

}  // namespace lockstep::train_internal

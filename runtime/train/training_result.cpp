#include "runtime/train/training_result.h"

#include <algorithm>
#include <cmath>

namespace lockstep {

nlohmann::json TrainingResult::to_json() const {
  return {{"steps", steps},
          {"samples", samples},
          {"final_train_loss", final_loss},
          {"train_loss_is", "the mean over every valid target of the global batch (all ranks)"},
          {"test_loss", last_eval.loss},
          {"test_accuracy", last_eval.accuracy},
          {"test_metrics", last_eval.metrics},
          {"test_samples", last_eval.samples},
          {"validation_loss", last_validation.loss},
          {"validation_metrics", last_validation.metrics},
          {"validation_samples", last_validation.samples},
          {"masked_targets", masked_targets},
          {"skipped_steps", skipped_steps},
          {"clipped_steps", clipped_steps},
          {"checkpoints", checkpoints},
          {"last_checkpoint_step", last_checkpoint},
          {"audits", audits},
          {"audits_disagreeing", audits_disagreeing},
          {"cross_checks", cross_checks},
          {"miscomputes", miscomputes},
          {"step_evidence_s", step_evidence_s},
          {"last_audit", last_audit},
          {"step_s_median", step_s_median},
          {"allreduce_hidden_share", allreduce_hidden_share},
          {"summation_regrids", summation_regrids},
          {"allreduce_bytes_per_step", allreduce_bytes_per_step},
          {"shared_gradient_storage", shared_gradients},
          {"scaler", scaler},
          {"overflows", overflows},
          {"stopped_at_step", stopped_at_step}};
}

int64_t total_steps(const JobConfig& config, int64_t steps_per_epoch) {
  if (config.job.steps > 0) return config.job.steps;
  return std::max<int64_t>(1, int64_t(std::ceil(config.job.epochs * double(steps_per_epoch))));
}

}  // namespace lockstep

// The state of the step loop: the checkpoints it writes, the checkpoint or
// state in memory it resumes from, the state it keeps when a step fails.
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/train/step_loop.h"

namespace lockstep::train_internal {

void StepLoop::resume_from(const nlohmann::json& meta, int64_t step, const std::string& from) {
  record_checkpoint_device(meta.value("device", std::string("cpu")));
  first_step_ = step;
  microbatches_done_ = meta.value("microbatches_done", int64_t(0));
  last_epoch_ = meta.value("epoch", int64_t(0));
  if (parts_.rank == 0)
    spdlog::info("resumed from {} at step {} ({} microbatches done per rank, epoch {}); parameter digest "
                 "verified on every rank", from == "memory" ? "the state held in memory" : "the checkpoint",
                 first_step_, microbatches_done_, last_epoch_);
  parts_.events.write({{"event", "resumed"}, {"step", first_step_}, {"folder", from}});
}

void StepLoop::keep_state_at_boundary() {
  if (!parts_.keep_state) return;
  buffers_->abandon_step();  // the forwards of a step in flight moved them
  *parts_.keep_state = capture_state(boundary_step_, state_meta(boundary_lr_, boundary_microbatches_, boundary_epoch_),
                                     model_, *optimizer_);
}

// A checkpoint after step `done` when one is due (skipped steps included).
// A stop that every rank agreed on (RunObserver::stop_requested) ends the
// run after this step, with a checkpoint there when checkpoints are on.
void StepLoop::checkpoint_after(int64_t done, double lr) {
  if (!checkpoints_on_) return;  // checkpoint.every may be 0
  if (done % config_.checkpoint.every != 0 && done != steps_ && !reducer_.stop_agreed()) return;
  auto scope = parts_.timer.measure(Phase::kCheckpoint);
  write_checkpoint(checkpoints_, done, state_meta(lr, microbatches_done_, last_epoch_), model_, *optimizer_,
                   parts_.rank, *parts_.control, int(config_.checkpoint.keep));
  ++result_.checkpoints;
  result_.last_checkpoint = done;
  if (parts_.evidence) parts_.evidence->on_checkpoint(done);
  parts_.events.write({{"event", "checkpoint"}, {"step", done}, {"folder", checkpoints_.step_folder(done)}});
}

nlohmann::json StepLoop::state_meta(double lr, int64_t microbatches_done, int64_t epoch) const {
  nlohmann::json meta = {{"microbatches_done", microbatches_done},
                         {"epoch", epoch},
                         {"lr", lr},
                         {"model", config_.model.name},
                         {"world_size", parts_.world_size},
                         {"seed", config_.job.seed},
                         {"batch_size", config_.data.batch_size},
                         {"global_batch", config_.data.global_batch},
                         {"microbatch", config_.data.microbatch},
                         {"accum_steps", config_.train.accum_steps},
                         {"optimizer", config_.optim.name},
                         {"device", device_.str()}};
  meta["settings"] = effective_settings(config_);
  std::string joined;
  for (const auto& setting : meta["settings"]) joined += setting.get<std::string>() + "\n";
  meta["config_digest"] = checksum_hex(joined);
  if (scaler_) meta["scaler"] = scaler_->state();
  return meta;
}

void StepLoop::record_checkpoint_device(const std::string& written_on) {
  const std::string here = device_.str();
  const bool same_kind = (written_on.rfind("cuda", 0) == 0) == device_.is_cuda();
  parts_.decisions.record(
      "checkpoint_device", written_on + " -> " + here,
      same_kind ? "tensors are saved on the host and loaded onto this rank's device; the random "
                  "streams continue where they stopped"
                : "a checkpoint is device-independent (tensors saved on the host): parameters, "
                  "buffers and optimizer state continue exactly, but " + here + " computes other "
                  "bits than " + written_on + " and draws dropout from another generator, so the "
                  "run continues, not bit-identical to one that stayed on " + written_on,
      /*warn=*/!same_kind);
}

}  // namespace lockstep::train_internal

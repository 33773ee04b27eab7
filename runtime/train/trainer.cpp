#include "runtime/train/trainer.h"
#include "runtime/train/step_loop.h"

#include <algorithm>
#include <functional>
#include <map>
#include <cmath>
#include <limits>
#include <optional>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "runtime/train/buffer_policy.h"
#include "runtime/train/recompute.h"
#include "runtime/audit/cross_check.h"
#include "runtime/train/device_feed.h"
#include "runtime/audit/seeding.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/data/augment.h"
#include "runtime/base/errors.h"
#include "runtime/train/fault_hooks.h"
#include "runtime/run/generation.h"
#include "runtime/loss/objective.h"
#include "runtime/train/progress.h"
#include "runtime/comm/reducer.h"

namespace lockstep {
namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

optim::OptimizerSpec optimizer_spec(const OptimSection& optim) {
  optim::OptimizerSpec spec;
  spec.name = optim.name;
  spec.lr = optim.lr;
  spec.momentum = optim.momentum;
  spec.weight_decay = optim.weight_decay;
  spec.nesterov = optim.nesterov;
  spec.beta1 = optim.beta1;
  spec.beta2 = optim.beta2;
  spec.eps = optim.eps;
  spec.alpha = optim.alpha;
  return spec;
}

ReducerOptions reducer_options(const JobConfig& config) {
  const CommSection& comm = config.comm;
  ReducerOptions options;
  options.bucket_bytes = std::max<int64_t>(1, int64_t(comm.bucket_mb * (1 << 20)));
  options.overlap = comm.overlap;
  options.error_on_unused = comm.unused_parameters == "error";
  options.exact = comm.summation == "exact";
  options.microbatches_per_step = microbatches_per_step(config);
  return options;
}

}  // namespace

namespace train_internal {


StepLoop::StepLoop(TrainerParts& parts)
    : parts_(parts), config_(parts.config), model_(*parts.model), parameters_(model_.parameters()),
      objective_(make_objective(config_.loss, model_)),
      reducer_(parameters_, parts.data_group, reducer_options(config_)),
      checkpoints_(parts.checkpoint_dir), device_(parts.model->device()) {
  const JobConfig& config = config_;
  parts_.decisions.record(
      "comm.summation", config.comm.summation,
      config.comm.summation == "exact"
          ? "each microbatch's gradient, loss sum and counts are summed over the step's " +
                std::to_string(microbatches_per_step_) + " microbatches of every rank in 64-bit integers (one grid per bucket, set by the step's "
                "largest magnitude): the same bits on any world size, whichever rank computed what; "
                "twice the bytes of float sums on the wire (comm.summation = float: today's path)"
          : "comm.summation = float: LibTorch's float sums in the all-reduce's order, started "
            "during backward; the bits depend on the world size and on which rank computed what "
            "(exact, the default, keeps them)",
      /*warn=*/false);
  parts_.decisions.record("gradient_buckets", std::to_string(reducer_.bucket_count()),
                          "comm.bucket_mb = " + fmt::format("{:g}", config.comm.bucket_mb) +
                              ", first bucket at most 1 MiB, reverse registration order, " +
                              (!config.comm.overlap ? "all-reduce after backward (comm.overlap = false)"
                               : config.comm.summation == "exact"
                                   ? "each put on its grid and all-reduced as soon as the step's last backward "
                                     "has produced it"
                                   : "all-reduce started during backward") +
                              "; parameters and gradients live in one buffer each, the "
                              "optimizer updates all of them per operation");
  auto [flat_params, flat_grads] = reducer_.flat();
  if (config.optim.name == "rmsprop")
    parts_.decisions.record("rmsprop_momentum", fmt::format("{:g}", config.optim.momentum),
                            "optim.momentum applies to rmsprop too; 0 is torch.optim.RMSprop's default");
  optimizer_ = optim::make_optimizer({{flat_params, flat_grads}}, optimizer_spec(config.optim));
  if (parts_.resume_in_memory) {
    load_state(*parts_.resume_in_memory, model_, *optimizer_, parts_.rank);
    resume_from(parts_.resume_in_memory->meta, parts_.resume_in_memory->step, "memory");
  } else if (parts_.resume) {
    load_checkpoint(checkpoints_, *parts_.resume, model_, *optimizer_, parts_.rank);
    resume_from(parts_.resume->meta, parts_.resume->step, parts_.resume->folder);
  }
  if (parts_.evidence && !parts_.resume_in_memory) parts_.evidence->on_checkpoint(parts_.resume ? first_step_ : 0);
  boundary_step_ = first_step_;
  boundary_microbatches_ = microbatches_done_;
  boundary_epoch_ = last_epoch_;
  if (parts_.steps_done) *parts_.steps_done = first_step_;
  const int64_t per_step = microbatches_per_step_;
  const int64_t first_index = parts_.rank * config.train.accum_steps;  // this rank's first microbatch of a step
  augmenter_.emplace(parse_augment(config.data.augment), uint64_t(config.job.seed));
  if (augmenter_->active()) {
    const at::Tensor sample = parts_.data.train.input_rows(torch::zeros({1}, torch::kLong));
    const int64_t index = first_step_ * per_step + first_index;
    const uint64_t first = augmenter_->draws_hash(index, config.data.batch_size, sample.size(-2), sample.size(-1));
    parts_.decisions.record("augment", config.data.augment,
                            "drawn from the job's seed and the microbatch's index in the run (step x " +
                                std::to_string(per_step) + " + its place in the step): different for every "
                                "microbatch, the same whichever rank computes it, in a rerun and after a resume");
    parts_.events.write({{"event", "augment"}, {"steps", config.data.augment},
                         {"batch_index", index}, {"draws_hash", fmt::format("{:016x}", first)}});
  }
  batches_.emplace(parts_.data.train, parts_.rank, parts_.world_size, uint64_t(config.job.seed),
                   config.data.global_batch, config.data.microbatch, int(config.data.prefetch), first_step_,
                   &*augmenter_, /*pin_memory=*/device_.is_cuda());
  feed_.emplace(*batches_, device_);
  if (device_.is_cuda())
    parts_.decisions.record("batch_copies", "pinned, one batch ahead on a copy stream",
                            "this rank trains on " + device_.str() + ": batches are pinned in host "
                            "memory as they are assembled, and the next one's host-to-device copy "
                            "overlaps the current step's compute");
  steps_ = total_steps(config, batches_->steps_per_epoch());
  if (parts_.observer) parts_.observer->on_total_steps(steps_);
  if ((parts_.resume || parts_.resume_in_memory) && first_step_ > steps_)
    throw InputError("the checkpoint to resume is at step " + std::to_string(first_step_) + ", past the " +
                     std::to_string(steps_) + " steps this job trains (job.steps / job.epochs); give more "
                     "to train further");
  if (parts_.resume && first_step_ == steps_ && parts_.rank == 0)
    parts_.decisions.record("train", "nothing left",
                            "the checkpoint to resume is at step " + std::to_string(first_step_) +
                                ", the job's last: the run was already complete", /*warn=*/true);
  schedule_ = {config.optim.lr, config.optim.warmup_steps, steps_, config.optim.schedule};
  if (parts_.rank == 0)
    spdlog::info("training {} steps: {} per epoch, each a global batch of {} in {} microbatches of {}, "
                 "{} per rank on {} ranks", steps_, batches_->steps_per_epoch(), config.data.global_batch,
                 per_step, config.data.microbatch, config.train.accum_steps, parts_.world_size);

  // Precision: autocast for the forward, fp32 children, the overflow finder.
  autocast_ = autocast_dtype(parts_.precision);
  model_.set_fp32_modules(split_names(config.precision.fp32_modules));
  model_.set_overflow_check(config.precision.check_overflow);
  const bool scaler_on = config.precision.scaler == "on" ||
                         (config.precision.scaler == "auto" && parts_.precision == "fp16");
  if (scaler_on) {
    auto chosen = optim::choose_scaler_options(steps_, config.precision.init_scale,
                                               config.precision.growth_interval);
    scaler_.emplace(chosen.options);
    parts_.decisions.record("grad_scaler", fmt::format("on, init_scale {:g}, growth_interval {}",
                                                       chosen.options.init_scale,
                                                       chosen.options.growth_interval),
                            (config.precision.scaler == "on" ? "precision.scaler = on; "
                                                             : "fp16 gradients need one; ") +
                                chosen.reason);
    const nlohmann::json* resumed = parts_.resume_in_memory ? &parts_.resume_in_memory->meta
                                    : parts_.resume          ? &parts_.resume->meta
                                                             : nullptr;
    if (resumed && resumed->contains("scaler")) scaler_->load((*resumed)["scaler"]);
  } else {
    parts_.decisions.record("grad_scaler", "off",
                            config.precision.scaler == "off" ? "precision.scaler = off"
                                                             : "precision " + parts_.precision +
                                                                   " needs no loss scale");
  }
  faults_.emplace(config, parts_.rank, parameters_);
  set_up_cross_checks();
  parts_.decisions.record("train_loss", "the mean over the global batch",
                          "loss " + objective_->name() + ": every rank's loss sum and count of valid " +
                              objective_->unit() + "s ride along with the gradient all-reduce, so the "
                              "logged loss is comparable across world sizes");
  buffers_.emplace(config.comm.buffers, config.comm.summation, model_.buffers(), parts_.data_group);
  parts_.decisions.record("buffers", buffers_->value(), buffers_->reason(), buffers_->ties_bits_to_world_size());
  // A short run with the default job.log_every would log a point or two:
  // about 10 points over the run instead, said as a decision.
  log_every_ = config.job.log_every;
  const auto source = config.sources.find("job.log_every");
  if ((source == config.sources.end() || source->second == "default") && steps_ < 10 * log_every_) {
    log_every_ = std::max<int64_t>(1, steps_ / 10);
    parts_.decisions.record("job.log_every", std::to_string(log_every_),
                            "the default " + std::to_string(config.job.log_every) + " would give " +
                                std::to_string(steps_ / config.job.log_every) + " point(s) in " +
                                std::to_string(steps_) + " steps; about 10 instead (set job.log_every to choose)");
  }
  progress_.emplace(steps_, parts_.terminal, log_every_);
  checkpoints_on_ = config.checkpoint.every > 0 && !parts_.checkpoint_dir.empty();
  if (config.checkpoint.every > 0 && !parts_.control)
    throw RunError("checkpoint.every is set but this trainer has no control group to agree on "
                   "checkpoints");
  // Start-up's decisions, each printed once with the ranks that made it.
  if (parts_.decisions.holding())
    parts_.decisions.print_held(parts_.rank, parts_.control
                                                 ? parts_.control->exchange("decisions", parts_.decisions.held_json())
                                                 : std::vector<std::string>{parts_.decisions.held_json()});
}

TrainingResult StepLoop::run() {
  try {
    return run_steps();
  } catch (const ModelFailure&) {
    throw;  // the model's own error: the job fails, nothing to keep
  } catch (const InputError&) {
    throw;
  } catch (const std::exception&) {
    // A collective that failed (a lost peer) or a generation the coordinator
    // ended: the parameters and optimizer state are those of the last step
    // boundary, which an elastic job continues from without a checkpoint.
    keep_state_at_boundary();
    throw;
  }
}

// The loop, step by step: gradients of the global batch, the update, then
// what follows a step (audits, checkpoints, the log, evaluation). A step
// that updates nothing (no valid target anywhere, or the scaler skipped it)
// still gets its audit and checkpoint.
TrainingResult StepLoop::run_steps() {
  model_.train(true);
  for (int64_t step = first_step_; step < steps_ && !reducer_.stop_agreed(); ++step) {
    throw_if_generation_ended("rank " + std::to_string(parts_.rank) + " before step " +
                              std::to_string(step + 1));
    // The ranks learn of a stop at different moments; the flag travels with
    // this step's gradients, so all of them stop after the same step.
    if (parts_.observer && parts_.observer->stop_requested()) reducer_.ask_to_stop();
    if (replaying() && parts_.evidence->last_step() == step + 1) reducer_.ask_to_stop();
    const auto step_start = PhaseTimer::Clock::now();
    const double lr = optim::scheduled_lr(schedule_, step);
    optimizer_->set_lr(lr);  // the reducer zeroes the gradients (its buckets)
    faults_->begin_step(step);

    const double global_valid = accumulate_gradients(step);
    finish_audit();  // the previous audit's all-gather travelled during this step
    result_.steps = step + 1;
    const bool updated = update(step, global_valid);
    if (parts_.evidence) {
      const auto digest_start = PhaseTimer::Clock::now();
      // The state every audit.every steps (10 without audits) and at the
      // end: a wrong update shows in the next step's microbatch digests,
      // so a digest of the whole model every step would only add its cost.
      const int64_t every = config_.audit.every > 0 ? config_.audit.every : 10;
      const bool state_now = parts_.rank == 0 && (replaying() || (step + 1) % every == 0 || step + 1 == steps_);
      parts_.evidence->on_step_end(step + 1, state_now ? state_digest() : StateDigest{});
      result_.step_evidence_s += std::chrono::duration<double>(PhaseTimer::Clock::now() - digest_start).count();
    }
    boundary_step_ = step + 1;
    boundary_microbatches_ = microbatches_done_;
    boundary_epoch_ = last_epoch_;
    boundary_lr_ = lr;
    start_audit(step + 1);
    if (updated && step == first_step_)  // start-up's end
      parts_.events.write({{"event", "first_step"}, {"step", step + 1}, {"total_steps", steps_}});
    checkpoint_after(step + 1, lr);
    if (!updated) {
      if (parts_.observer)
        parts_.observer->on_skipped_steps(result_.skipped_steps + (scaler_ ? scaler_->skipped() : 0));
      continue;
    }
    log_step(step, lr, global_valid,
             std::chrono::duration<double>(PhaseTimer::Clock::now() - step_start).count());
    if (config_.eval.every > 0 && (step + 1) % config_.eval.every == 0 && step + 1 < steps_)
      evaluate_now(step + 1);
  }
  progress_->finish();
  if (reducer_.stop_agreed() && result_.steps < steps_) return stopped();
  return finish();
}

double StepLoop::accumulate_gradients(int64_t step) {
  PhaseTimer& timer = parts_.timer;
  const bool check = checker_ && checker_->due(step + 1);
  MicrobatchDigest own;  // this rank's microbatch that another recomputes
  std::vector<at::Tensor> own_gradients;
  for (int64_t micro = 0; micro < config_.train.accum_steps; ++micro) {
    Batch batch;
    {
      auto scope = timer.measure(Phase::kData);
      batch = feed_->next();
    }
    if (batch.step != step)
      throw std::logic_error(fmt::format("rank {}: the batch stream is at step {}, the trainer at {}",
                                         parts_.rank, batch.step, step));
    ++microbatches_done_;
    last_epoch_ = batch.epoch;
    buffers_->begin_microbatch(micro);
    seed_everything(config_.test.no_reseed ? uint64_t(config_.job.seed)
                                           : microbatch_seed(uint64_t(config_.job.seed), step, batch.microbatch));
    auto scope = timer.measure(Phase::kForwardBackward);
    MaskedLoss loss;
    model_call("training forward", step + 1, [&] {
      loss = objective_->loss(forward_output(model_, batch.inputs, autocast_), batch.targets);
    });
    if (const std::string overflow = model_.take_overflow(); !overflow.empty()) {
      ++result_.overflows;
      if (result_.overflows <= 3)
        spdlog::error("precision.check_overflow: rank {} step {} (input batch {} of this rank): "
                      "the first module whose output holds inf or NaN is '{}'", parts_.rank,
                      step + 1, microbatches_done_ - 1, overflow);
      parts_.events.write({{"event", "overflow"}, {"step", step + 1},
                           {"batch_index", microbatches_done_ - 1}, {"module", overflow}});
    }
    buffers_->end_microbatch();
    faults_->on_loss(step, loss.sum);
    const double value = loss.sum.item<double>();
    if (!std::isfinite(value) && !scaler_)  // with a scaler: the step is skipped in update()
      throw RunError("non-finite training loss (" + std::to_string(value) + ") at step " +
                     std::to_string(step) + " on rank " + std::to_string(parts_.rank) +
                     " (epoch " + std::to_string(batch.epoch) + ", microbatch " +
                     std::to_string(micro) + ")");
    reducer_.begin_microbatch(micro, config_.train.accum_steps, double(loss.valid),
                              std::isfinite(value) ? value : 0.0, double(batch.targets.size(0)));
    model_call("training backward", step + 1, [&] { (scaler_ ? loss.sum * scaler_->scale() : loss.sum).backward(); });
    if (parts_.evidence || check) {  // this microbatch's own gradient, before any sum
      const auto digest_start = PhaseTimer::Clock::now();
      const std::vector<at::Tensor> gradients = current_gradients(parameters_);
      const MicrobatchDigest digest = digest_microbatch(step + 1, batch.microbatch, gradients, value, double(loss.valid));
      if (parts_.evidence) parts_.evidence->on_microbatch(digest);
      result_.step_evidence_s += std::chrono::duration<double>(PhaseTimer::Clock::now() - digest_start).count();
      if (check && batch.microbatch == checker_->own_checked(step + 1)) {
        own = digest;
        for (const auto& g : gradients) own_gradients.push_back(g.clone());
      }
    }
    reducer_.end_microbatch();  // exact summation: this microbatch's gradient set aside
    result_.masked_targets += loss.masked;
  }
  std::vector<Miscompute> miscomputed;
  if (check) miscomputed = cross_check(step, own, own_gradients);  // while the gradients' sums travel
  auto scope = timer.measure(Phase::kCommWait);
  const double global_valid = reducer_.finish();
  // Before the buffers' sum: a step that is not applied leaves them as the step found them.
  if (!miscomputed.empty()) act_on_miscompute(miscomputed);
  buffers_->sync(microbatches_per_step_);  // this step's forwards changed them
  return global_valid;
}

bool StepLoop::update(int64_t step, double global_valid) {
  if (global_valid == 0) {
    ++result_.skipped_steps;
    spdlog::warn("step {}: no valid target in the global batch on any rank; no update", step);
    parts_.events.write({{"event", "skipped_step"}, {"step", step}, {"reason", "no valid target"}});
    return false;
  }
  auto scope = parts_.timer.measure(Phase::kOptimizer);
  if (scaler_) {
    // Unscale, then one verdict from the all-reduced buffer: the same on every rank.
    const double scale = scaler_->scale();
    reducer_.flat().second.mul_(1.0 / scale);
    if (!scaler_->update(step + 1, reducer_.nonfinite_count() > 0)) {
      spdlog::warn("step {} skipped by the gradient scaler: inf/NaN gradients after the "
                   "all-reduce (every rank skips it); scale {:g} -> {:g}, {} skipped so far",
                   step + 1, scale, scaler_->scale(), scaler_->skipped());
      parts_.events.write({{"event", "scaler_skipped_step"}, {"step", step + 1},
                           {"scale_before", scale}, {"scale_after", scaler_->scale()}});
      return false;
    }
  }
  result_.samples += int64_t(global_valid);
  // Clipping measures every gradient (and finds shared storage); without
  // it, the reducer's flat buckets answer the non-finite question in one pass.
  optim::ClipResult clip;
  if (config_.optim.clip_norm > 0) clip = optim::clip_grad_norm(parameters_, config_.optim.clip_norm);
  else clip.nonfinite = reducer_.nonfinite_count();
  if (!clip.shared_storage.empty() && !reported_sharing_) {
    reported_sharing_ = true;
    result_.shared_gradients = clip.shared_storage;
    for (const auto& group : clip.shared_storage)
      parts_.decisions.record("clip_shared_storage", join_names(group),
                              "these gradients share one storage: counted and scaled once",
                              /*warn=*/true);
  }
  if (clip.nonfinite > 0)
    throw RunError(std::to_string(clip.nonfinite) + " non-finite gradient values at step " +
                   std::to_string(step) + " on rank " + std::to_string(parts_.rank) +
                   " (after the all-reduce: every rank sees them)");
  result_.clipped_steps += clip.clipped;
  faults_->before_update(step + 1);
  optimizer_->step();
  faults_->after_update(step + 1);
  return true;
}

void StepLoop::log_step(int64_t step, double lr, double global_valid, double seconds) {
  window_loss_ += reducer_.global_loss_sum() / global_valid;  // the global batch's mean
  window_samples_ += reducer_.global_samples();
  window_seconds_ += seconds;
  if (step >= first_step_ + 10) step_times_.push_back(seconds);
  ++window_steps_;
  const double samples_per_s = window_seconds_ > 0 ? window_samples_ / window_seconds_ : 0.0;
  const double mean_loss = window_loss_ / double(window_steps_);
  if (parts_.rank == 0) progress_->update(step + 1, mean_loss, lr, samples_per_s);
  if (parts_.steps_done) *parts_.steps_done = step + 1;
  if (parts_.observer) {
    parts_.observer->on_step(step + 1, mean_loss, samples_per_s);
    const int64_t skipped = parts_.data.unreadable_in_batches();
    if (skipped != skipped_reported_)
      parts_.observer->on_skipped_files(int64_t(parts_.data.bad_files.size()), skipped_reported_ = skipped);
  }
  if ((step + 1) % log_every_ == 0 || step + 1 == steps_) {
    result_.final_loss = mean_loss;
    nlohmann::json event = {{"event", "step"},
                            {"step", step + 1},
                            {"loss", mean_loss},
                            {"lr", lr},
                            {"samples_per_s", samples_per_s},
                            {"phases", parts_.timer.to_json(0)}};
    // The scale now and the steps it threw away so far: a falling scale is lost steps.
    if (scaler_) event["scaler"] = {{"scale", scaler_->scale()}, {"skipped", scaler_->skipped()}};
    parts_.events.write(event);
    window_loss_ = window_samples_ = window_seconds_ = 0;
    window_steps_ = 0;
  }
}

void StepLoop::model_call(const char* phase, int64_t step, const std::function<void()>& call) {
  run_model_call(fmt::format("{} at step {}", phase, step), parts_.precision, model_, call);
}

void StepLoop::evaluate_now(int64_t step, bool final) {
  const bool validation = !final && parts_.data.has_validation();
  EvalResult& figures = validation ? result_.last_validation : result_.last_eval;
  {
    auto scope = parts_.timer.measure(Phase::kEval);
    figures = buffers_->as_saved([&] {
      return evaluate(model_, *objective_, validation ? parts_.data.validation : parts_.data.test,
                      parts_.rank, parts_.world_size, config_.eval.batch_size, parts_.data_group,
                      parts_.eval_precision,
                      fmt::format("{} at step {}", validation ? "validation" : "evaluation", step));
    });
  }
  const std::string split = validation ? "validation" : "test";
  parts_.events.write({{"event", "eval"}, {"step", step}, {"split", split}, {"loss", figures.loss},
                       {"accuracy", figures.accuracy}, {"metrics", figures.metrics}});
  std::string summary = describe_metrics(*objective_, figures);
  if (validation) summary.replace(0, 4, "validation");  // "test loss ..." -> "validation loss ..."
  else result_.eval_summary = summary;
  if (parts_.rank == 0 && !final) spdlog::info("eval at step {}: {}", step, summary);
  if (auto previous = previous_evals_.find(split); previous != previous_evals_.end()) {
    const std::string noise =
        change_within_noise(objective_->headline(), previous->second.first, previous->second.second, step, figures);
    if (!noise.empty() && parts_.rank == 0 && noise_said_++ == 0)
      spdlog::warn("{} evaluation: {} (said once; each such evaluation is an eval_within_noise event)", split, noise);
    if (!noise.empty()) parts_.events.write({{"event", "eval_within_noise"}, {"step", step}, {"split", split},
                                             {"what", noise}});
  }
  previous_evals_[split] = {step, figures};
  if (parts_.observer) parts_.observer->on_eval("step " + std::to_string(step) + ": " + summary);
}

// Audits: digests after optimizer step s, their all-gather overlapping
// step s + 1, compared before step s + 1 changes anything (the last one at once).
void StepLoop::start_audit(int64_t done) {
  if (!parts_.auditor || !parts_.auditor->due(done, steps_)) return;
  {
    auto scope = parts_.timer.measure(Phase::kAudit);
    parts_.auditor->start(done);
  }
  if (done == steps_) finish_audit();
}

void StepLoop::finish_audit() {
  if (!parts_.auditor || !parts_.auditor->started()) return;
  auto scope = parts_.timer.measure(Phase::kAudit);
  AuditResult audit = parts_.auditor->finish(*optimizer_);
  ++result_.audits;
  result_.audits_disagreeing += !audit.agreed;
  result_.last_audit = audit.verdict();
  double worst = 0;
  for (const auto& finding : audit.findings)
    for (double d : finding.max_abs_diff) worst = std::max(worst, d);
  parts_.events.write({{"event", "audit_result"}, {"step", audit.step}, {"agreed", audit.agreed},
                       {"max_abs_diff", worst}, {"verdict", audit.verdict()}});
  if (parts_.observer) parts_.observer->on_audit(audit.to_json());
}

// Stopped on request: no final evaluation, the run is not over.
TrainingResult StepLoop::stopped() {
  finish_audit();
  result_.stopped_at_step = result_.steps;
  if (replaying()) return result_;  // a replay ends where it was asked to
  if (parts_.observer && parts_.observer->regroup_requested()) {
    keep_state_at_boundary();  // not the end of the run: the next generation continues from here
    parts_.events.write({{"event", "regroup"}, {"step", result_.steps}});
    return result_;
  }
  const bool saved = checkpoints_on_ && result_.last_checkpoint == result_.steps;
  parts_.events.write({{"event", "stopped"}, {"step", result_.steps}, {"checkpoint", saved}});
  if (parts_.rank == 0) {
    if (saved)
      spdlog::warn("stopped after step {} of {} on request, with a checkpoint there: resume "
                   "the run folder with --resume", result_.steps, steps_);
    else
      spdlog::warn("stopped after step {} of {} on request, without a checkpoint "
                   "(checkpoint.every = 0): a resumed run starts again from its newest "
                   "checkpoint or step 0", result_.steps, steps_);
  }
  return result_;
}

TrainingResult StepLoop::finish() {
  if (scaler_) {
    const double share =
        scaler_->steps_seen() > 0 ? double(scaler_->skipped()) / double(scaler_->steps_seen()) : 0.0;
    result_.scaler = {{"skipped", scaler_->skipped()}, {"steps", scaler_->steps_seen()},
                      {"skipped_share", share}, {"final_scale", scaler_->scale()},
                      {"skipped_steps", scaler_->skipped_steps()}};
    if (share > config_.precision.max_skipped_share)
      parts_.decisions.record("grad_scaler_skipped", fmt::format("{} of {} steps ({:.1f}%)",
                                                                 scaler_->skipped(),
                                                                 scaler_->steps_seen(), 100 * share),
                              fmt::format("more than precision.max_skipped_share = {:g}: those steps "
                                          "trained nothing; raise precision.init_scale's headroom "
                                          "(lower it) or find the overflow "
                                          "(precision.check_overflow = true)",
                                          config_.precision.max_skipped_share),
                              /*warn=*/true);
  }
  result_.allreduce_hidden_share = reducer_.hidden_share();
  result_.summation_regrids = reducer_.regrids();
  const int64_t trained = result_.steps - first_step_;
  result_.allreduce_bytes_per_step = trained > 0 ? double(reducer_.bytes_reduced()) / double(trained) : 0.0;
  if (!step_times_.empty()) {
    std::nth_element(step_times_.begin(), step_times_.begin() + long(step_times_.size() / 2),
                     step_times_.end());
    result_.step_s_median = step_times_[step_times_.size() / 2];
  }
  if (!replaying()) evaluate_now(steps_, /*final=*/true);
  return result_;
}

}  // namespace train_internal

TrainingResult train(TrainerParts parts) { return train_internal::StepLoop(parts).run(); }

}  // namespace lockstep

#include "runtime/trainer.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <limits>
#include <optional>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "runtime/checkpoint.h"
#include "runtime/errors.h"
#include "runtime/generation.h"
#include "runtime/masked_loss.h"
#include "runtime/progress.h"
#include "runtime/reducer.h"

namespace lockstep {
namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Test-only failure injection (test.fail_*), so the launcher's and the
// trainer's failure paths can be exercised with real processes.
void maybe_fail(const JobConfig& config, int rank, int64_t step, at::Tensor& loss_sum) {
  if (config.test.fail_rank != rank || config.test.fail_step != step) return;
  // Only in the first test.fail_generations generations, so that a
  // restarted job can get past it.
  const char* generation = std::getenv("LOCKSTEP_RESTART_COUNT");
  if (generation && std::atoll(generation) >= config.test.fail_generations) return;
  if (config.test.fail_kind == "kill") {
    spdlog::error("test.fail_kind = kill: rank {} sends itself SIGKILL at step {}", rank, step);
    std::fflush(nullptr);
    std::raise(SIGKILL);
  }
  if (config.test.fail_kind == "exit") {
    spdlog::error("test.fail_kind = exit: rank {} exits with status 3 at step {}", rank, step);
    std::fflush(nullptr);
    std::_Exit(3);
  }
  loss_sum = loss_sum * std::numeric_limits<float>::quiet_NaN();
}

at::Tensor& named_tensor(std::vector<std::pair<std::string, at::Tensor>>& named,
                         const std::string& name) {
  for (auto& [n, t] : named)
    if (n == name) return t;
  throw InputError("fault.inject names tensor '" + name + "', which the model does not have");
}

// fault.inject perturb: after the optimizer step, on one rank only.
void apply_perturbation(const std::vector<InjectedFault>& faults, int rank, int64_t step,
                        std::vector<std::pair<std::string, at::Tensor>>& named) {
  for (const auto& f : faults) {
    if (f.kind != "perturb" || f.rank != rank || f.step != step) continue;
    torch::NoGradGuard no_grad;
    named_tensor(named, f.tensor).view(-1)[0].add_(f.amount);
    spdlog::warn("fault.inject: added {:g} to element 0 of {} on rank {} after step {}", f.amount,
                 f.tensor, rank, step);
  }
}

// fault.inject double_scale: a per-tensor gradient scale by 0.5 on every
// rank, where on the faulty rank a second entry aliases the tensor's
// gradient (shared storage), so its values are scaled twice there.
void apply_double_scale(const std::vector<InjectedFault>& faults, int rank, int64_t step,
                        std::vector<std::pair<std::string, at::Tensor>>& named) {
  for (const auto& f : faults) {
    if (f.kind != "double_scale" || f.step != step) continue;
    at::Tensor grad = named_tensor(named, f.tensor).mutable_grad();
    std::vector<at::Tensor> entries{grad};
    if (f.rank == rank) entries.push_back(grad.view_as(grad));  // same storage
    for (auto& g : entries) g.mul_(0.5);
    if (f.rank == rank)
      spdlog::warn("fault.inject: the gradient of {} shares storage with a second entry on rank {} "
                   "and was scaled twice at step {}", f.tensor, rank, step);
  }
}

}  // namespace

nlohmann::json TrainingResult::to_json() const {
  return {{"steps", steps},
          {"samples", samples},
          {"final_train_loss", final_loss},
          {"test_loss", last_eval.loss},
          {"test_accuracy", last_eval.accuracy},
          {"test_samples", last_eval.samples},
          {"masked_targets", masked_targets},
          {"skipped_steps", skipped_steps},
          {"clipped_steps", clipped_steps},
          {"checkpoints", checkpoints},
          {"last_checkpoint_step", last_checkpoint},
          {"audits", audits},
          {"audits_disagreeing", audits_disagreeing},
          {"last_audit", last_audit},
          {"step_s_median", step_s_median},
          {"allreduce_hidden_share", allreduce_hidden_share},
          {"shared_gradient_storage", shared_gradients},
          {"scaler", scaler},
          {"overflows", overflows},
          {"stopped_at_step", stopped_at_step}};
}

int64_t total_steps(const JobConfig& config, int64_t batches_per_epoch) {
  if (config.job.steps > 0) return config.job.steps;
  double batches = config.job.epochs * double(batches_per_epoch);
  return std::max<int64_t>(1, int64_t(std::ceil(batches / double(config.train.accum_steps))));
}

TrainingResult train(TrainerParts parts) {
  const JobConfig& config = parts.config;
  Model& model = *parts.model;
  TrainingResult result;

  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : model.named_parameters()) {
    named.emplace_back(item.key(), item.value());
  }
  ReducerOptions reducer_options;
  reducer_options.bucket_bytes = std::max<int64_t>(1, int64_t(config.comm.bucket_mb * (1 << 20)));
  reducer_options.overlap = config.comm.overlap;
  reducer_options.error_on_unused = config.comm.unused_parameters == "error";
  GradientReducer reducer(named, parts.data_group, reducer_options);
  parts.decisions.record("gradient_buckets", std::to_string(reducer.bucket_count()),
                         "comm.bucket_mb = " + fmt::format("{:g}", config.comm.bucket_mb) +
                             ", first bucket at most 1 MiB, reverse registration order, " +
                             (config.comm.overlap ? "all-reduce started during backward"
                                                  : "all-reduce after backward (comm.overlap = false)") +
                             "; parameters and gradients live in one buffer each, the "
                             "optimizer updates all of them per operation");

  auto [flat_params, flat_grads] = reducer.flat();
  std::vector<optim::Segment> segments{{flat_params, flat_grads}};
  optim::OptimizerSpec optimizer_spec;
  optimizer_spec.name = config.optim.name;
  optimizer_spec.lr = config.optim.lr;
  optimizer_spec.momentum = config.optim.momentum;
  optimizer_spec.weight_decay = config.optim.weight_decay;
  auto optimizer = optim::make_optimizer(std::move(segments), optimizer_spec);
  CheckpointStore checkpoints(parts.checkpoint_dir);
  int64_t first_step = 0, microbatches_done = 0, last_epoch = 0;
  if (parts.resume) {
    load_checkpoint(checkpoints, *parts.resume, model, *optimizer, parts.rank);
    first_step = parts.resume->step;
    microbatches_done = parts.resume->meta.value("microbatches_done", int64_t(0));
    last_epoch = parts.resume->meta.value("epoch", int64_t(0));
    if (parts.rank == 0)
      spdlog::info("resumed from the checkpoint at step {} ({} microbatches done per rank, epoch "
                   "{}); parameter digest verified on every rank", first_step, microbatches_done,
                   last_epoch);
    parts.events.write({{"event", "resumed"}, {"step", first_step}, {"folder", parts.resume->folder}});
  }
  if (parts.steps_done) *parts.steps_done = first_step;
  BatchStream batches(parts.data.train, parts.rank, parts.world_size, uint64_t(config.job.seed),
                      config.data.batch_size, int(config.data.prefetch), microbatches_done);
  const int64_t steps = total_steps(config, batches.batches_per_epoch());
  if (parts.resume && first_step > steps)
    throw InputError("the checkpoint to resume is at step " + std::to_string(first_step) + ", past the " +
                     std::to_string(steps) + " steps this job trains (job.steps / job.epochs); give more "
                     "to train further");
  if (parts.resume && first_step == steps && parts.rank == 0)
    parts.decisions.record("train", "nothing left",
                           "the checkpoint to resume is at step " + std::to_string(first_step) +
                               ", the job's last: the run was already complete", /*warn=*/true);
  optim::ScheduleSpec schedule{config.optim.lr, config.optim.warmup_steps, steps,
                               config.optim.schedule};
  if (parts.rank == 0)
    spdlog::info("training {} steps: {} batches of {} per rank per epoch, accum_steps {}, {} ranks",
                 steps, batches.batches_per_epoch(), config.data.batch_size,
                 config.train.accum_steps, parts.world_size);

  const std::vector<InjectedFault> faults = parse_injected_faults(config.fault.inject);

  // Precision: autocast for the forward, fp32 children, the overflow finder.
  const at::ScalarType autocast = parts.precision == "bf16" ? at::kBFloat16 : at::kFloat;
  model.set_fp32_modules(split_names(config.precision.fp32_modules));
  model.set_overflow_check(config.precision.check_overflow);
  std::optional<optim::GradScaler> scaler;
  const bool scaler_on = config.precision.scaler == "on" ||
                         (config.precision.scaler == "auto" && parts.precision == "fp16");
  if (scaler_on) {
    auto chosen = optim::choose_scaler_options(steps, config.precision.init_scale,
                                               config.precision.growth_interval);
    scaler.emplace(chosen.options);
    parts.decisions.record("grad_scaler", fmt::format("on, init_scale {:g}, growth_interval {}",
                                                      chosen.options.init_scale,
                                                      chosen.options.growth_interval),
                           (config.precision.scaler == "on" ? "precision.scaler = on; "
                                                            : "fp16 gradients need one; ") +
                               chosen.reason);
    if (parts.resume && parts.resume->meta.contains("scaler")) scaler->load(parts.resume->meta["scaler"]);
  } else {
    parts.decisions.record("grad_scaler", "off",
                           config.precision.scaler == "off" ? "precision.scaler = off"
                                                            : "precision " + parts.precision +
                                                                  " needs no loss scale");
  }
  // fault.inject inf_grad: a gradient hook on this rank writes inf into
  // element 0 before the gradient reaches the reducer's bucket.
  int64_t current_step = first_step;
  for (const auto& f : faults) {
    if (f.kind != "inf_grad" || f.rank != parts.rank) continue;
    named_tensor(named, f.tensor).register_hook([&current_step, f](at::Tensor grad) {
      if (current_step + 1 != f.step) return grad;
      spdlog::warn("fault.inject: element 0 of the gradient of {} is inf on rank {} in step {}",
                   f.tensor, f.rank, f.step);
      at::Tensor planted = grad.clone();
      planted.view(-1)[0] = std::numeric_limits<float>::infinity();
      return planted;
    });
  }
  ProgressPrinter progress(steps, parts.terminal, config.job.log_every);
  PhaseTimer& timer = parts.timer;
  model.train();
  double window_loss = 0, window_samples = 0, window_seconds = 0;
  int64_t window_steps = 0;
  bool reported_sharing = false;
  std::vector<double> step_times;  // after warm-up, for the median

  // Audits: digests after optimizer step s, their all-gather overlapping
  // step s + 1, compared before step s + 1 changes anything (the last one
  // at once).
  auto finish_audit = [&] {
    if (!parts.auditor || !parts.auditor->started()) return;
    auto scope = timer.measure(Phase::kAudit);
    AuditResult audit = parts.auditor->finish(*optimizer);
    ++result.audits;
    result.audits_disagreeing += !audit.agreed;
    result.last_audit = audit.verdict();
    if (parts.observer) parts.observer->on_audit(audit.to_json());
  };
  auto audit_after = [&](int64_t done) {
    if (!parts.auditor || !parts.auditor->due(done, steps)) return;
    {
      auto scope = timer.measure(Phase::kAudit);
      parts.auditor->start(done);
    }
    if (done == steps) finish_audit();
  };

  const bool checkpoints_on = config.checkpoint.every > 0 && !parts.checkpoint_dir.empty();
  if (config.checkpoint.every > 0 && !parts.control)
    throw RunError("checkpoint.every is set but this trainer has no control group to agree on "
                   "checkpoints");

  // A checkpoint after step `done` when one is due (skipped steps included).
  // A stop that every rank agreed on (RunObserver::stop_requested) ends
  // the run after this step, with a checkpoint there when checkpoints are on.
  auto checkpoint_after = [&](int64_t done, double lr) {
    if (!checkpoints_on) return;  // checkpoint.every may be 0
    if (done % config.checkpoint.every != 0 && done != steps && !reducer.stop_agreed()) return;
    auto scope = timer.measure(Phase::kCheckpoint);
    nlohmann::json meta = {{"microbatches_done", microbatches_done},
                           {"epoch", last_epoch},
                           {"lr", lr},
                           {"model", config.model.name},
                           {"world_size", parts.world_size},
                           {"seed", config.job.seed},
                           {"batch_size", config.data.batch_size},
                           {"accum_steps", config.train.accum_steps},
                           {"optimizer", config.optim.name}};
    meta["settings"] = effective_settings(config);
    std::string joined;
    for (const auto& setting : meta["settings"]) joined += setting.get<std::string>() + "\n";
    meta["config_digest"] = checksum_hex(joined);
    if (scaler) meta["scaler"] = scaler->state();
    write_checkpoint(checkpoints, done, meta, model, *optimizer, parts.rank, *parts.control,
                     int(config.checkpoint.keep));
    ++result.checkpoints;
    result.last_checkpoint = done;
    parts.events.write({{"event", "checkpoint"}, {"step", done}, {"folder", checkpoints.step_folder(done)}});
  };

  for (int64_t step = first_step; step < steps && !reducer.stop_agreed(); ++step) {
    throw_if_generation_ended("rank " + std::to_string(parts.rank) + " before step " +
                              std::to_string(step + 1));
    // The ranks learn of a stop at different moments; the flag travels with
    // this step's gradients, so all of them stop after the same step.
    if (parts.observer && parts.observer->stop_requested()) reducer.ask_to_stop();
    const auto step_start = PhaseTimer::Clock::now();
    current_step = step;
    const double lr = optim::scheduled_lr(schedule, step);
    optimizer->set_lr(lr);  // the reducer zeroes the gradients (its buckets)

    double local_valid = 0, local_loss_sum = 0;
    for (int64_t micro = 0; micro < config.train.accum_steps; ++micro) {
      Batch batch;
      {
        auto scope = timer.measure(Phase::kData);
        batch = batches.next();
      }
      ++microbatches_done;
      last_epoch = batch.epoch;
      auto scope = timer.measure(Phase::kForwardBackward);
      MaskedLoss loss = masked_cross_entropy_sum(forward_logits(model, batch.images, autocast),
                                                 batch.labels);
      if (!model.first_overflow().empty()) {
        ++result.overflows;
        if (result.overflows <= 3)
          spdlog::error("precision.check_overflow: rank {} step {} (input batch {} of this rank): "
                        "the first module whose output holds inf or NaN is '{}'", parts.rank,
                        step + 1, microbatches_done - 1, model.first_overflow());
        parts.events.write({{"event", "overflow"}, {"step", step + 1},
                            {"batch_index", microbatches_done - 1},
                            {"module", model.first_overflow()}});
        model.clear_overflow();
      }
      maybe_fail(config, parts.rank, step, loss.sum);
      const double value = loss.sum.item<double>();
      if (!std::isfinite(value) && !scaler)  // with a scaler: the step is skipped below
        throw RunError("non-finite training loss (" + std::to_string(value) + ") at step " +
                       std::to_string(step) + " on rank " + std::to_string(parts.rank) +
                       " (epoch " + std::to_string(batch.epoch) + ", microbatch " +
                       std::to_string(micro) + ")");
      local_valid += double(loss.valid);
      reducer.begin_microbatch(micro, config.train.accum_steps, local_valid);
      (scaler ? loss.sum * scaler->scale() : loss.sum).backward();
      if (std::isfinite(value)) local_loss_sum += value;
      result.masked_targets += loss.masked;
    }

    double global_valid = 0;
    {
      auto scope = timer.measure(Phase::kCommWait);
      global_valid = reducer.finish();
    }
    finish_audit();  // the previous audit's all-gather travelled during this step
    result.steps = step + 1;
    if (global_valid == 0) {
      audit_after(step + 1);
      checkpoint_after(step + 1, lr);
      ++result.skipped_steps;
      spdlog::warn("step {}: no valid target in the global batch on any rank; no update", step);
      parts.events.write({{"event", "skipped_step"}, {"step", step}, {"reason", "no valid target"}});
      continue;
    }
    if (scaler) {
      // Unscale, then one verdict from the all-reduced buffer: the same on every rank.
      auto scope = timer.measure(Phase::kOptimizer);
      const double scale = scaler->scale();
      reducer.flat().second.mul_(1.0 / scale);
      if (!scaler->update(step + 1, reducer.nonfinite_count() > 0)) {
        spdlog::warn("step {} skipped by the gradient scaler: inf/NaN gradients after the "
                     "all-reduce (every rank skips it); scale {:g} -> {:g}, {} skipped so far",
                     step + 1, scale, scaler->scale(), scaler->skipped());
        parts.events.write({{"event", "scaler_skipped_step"}, {"step", step + 1},
                            {"scale_before", scale}, {"scale_after", scaler->scale()}});
        audit_after(step + 1);
        checkpoint_after(step + 1, lr);
        continue;
      }
    }
    result.samples += int64_t(global_valid);
    {
      auto scope = timer.measure(Phase::kOptimizer);
      // Clipping measures every gradient (and finds shared storage); without
      // it, the reducer's flat buckets answer the non-finite question in one pass.
      optim::ClipResult clip;
      if (config.optim.clip_norm > 0) clip = optim::clip_grad_norm(named, config.optim.clip_norm);
      else clip.nonfinite = reducer.nonfinite_count();
      if (!clip.shared_storage.empty() && !reported_sharing) {
        reported_sharing = true;
        result.shared_gradients = clip.shared_storage;
        for (const auto& group : clip.shared_storage)
          parts.decisions.record("clip_shared_storage", join_names(group),
                                 "these gradients share one storage: counted and scaled once",
                                 /*warn=*/true);
      }
      if (clip.nonfinite > 0)
        throw RunError(std::to_string(clip.nonfinite) + " non-finite gradient values at step " +
                       std::to_string(step) + " on rank " + std::to_string(parts.rank) +
                       " (after the all-reduce: every rank sees them)");
      result.clipped_steps += clip.clipped;
      apply_double_scale(faults, parts.rank, step + 1, named);
      optimizer->step();
      apply_perturbation(faults, parts.rank, step + 1, named);
    }
    audit_after(step + 1);
    if (step == first_step)  // start-up's end
      parts.events.write({{"event", "first_step"}, {"step", step + 1}});
    checkpoint_after(step + 1, lr);

    const double step_seconds =
        std::chrono::duration<double>(PhaseTimer::Clock::now() - step_start).count();
    window_loss += local_valid > 0 ? local_loss_sum / local_valid : 0.0;
    window_samples += global_valid;
    window_seconds += step_seconds;
    if (step >= first_step + 10) step_times.push_back(step_seconds);
    ++window_steps;
    const double samples_per_s = window_seconds > 0 ? window_samples / window_seconds : 0.0;
    const double mean_loss = window_loss / double(window_steps);
    if (parts.rank == 0) progress.update(step + 1, mean_loss, lr, samples_per_s);
    if (parts.steps_done) *parts.steps_done = step + 1;
    if (parts.observer) parts.observer->on_step(step + 1, mean_loss, samples_per_s);
    if ((step + 1) % config.job.log_every == 0 || step + 1 == steps) {
      result.final_loss = mean_loss;
      parts.events.write({{"event", "step"},
                          {"step", step + 1},
                          {"loss", mean_loss},
                          {"lr", lr},
                          {"samples_per_s", samples_per_s},
                          {"phases", timer.to_json(0)}});
      window_loss = window_samples = window_seconds = 0;
      window_steps = 0;
    }
    const bool eval_now = config.eval.every > 0 && (step + 1) % config.eval.every == 0;
    if (eval_now && step + 1 < steps) {
      auto scope = timer.measure(Phase::kEval);
      result.last_eval = evaluate(model, parts.data.test, parts.rank, parts.world_size,
                                  config.eval.batch_size, parts.data_group, parts.precision);
      parts.events.write({{"event", "eval"}, {"step", step + 1}, {"loss", result.last_eval.loss},
                          {"accuracy", result.last_eval.accuracy}});
      if (parts.rank == 0)
        spdlog::info("eval at step {}: test loss {:.4f}, accuracy {:.4f}", step + 1,
                     result.last_eval.loss, result.last_eval.accuracy);
    }
  }
  progress.finish();
  if (reducer.stop_agreed() && result.steps < steps) {
    finish_audit();
    result.stopped_at_step = result.steps;
    const bool saved = checkpoints_on && result.last_checkpoint == result.steps;
    parts.events.write({{"event", "stopped"}, {"step", result.steps}, {"checkpoint", saved}});
    if (parts.rank == 0) {
      if (saved)
        spdlog::warn("stopped after step {} of {} on request, with a checkpoint there: resume "
                     "the run folder with --resume", result.steps, steps);
      else
        spdlog::warn("stopped after step {} of {} on request, without a checkpoint "
                     "(checkpoint.every = 0): a resumed run starts again from its newest "
                     "checkpoint or step 0", result.steps, steps);
    }
    return result;  // no final evaluation: the run is not over
  }
  if (scaler) {
    const double share = scaler->steps_seen() > 0 ? double(scaler->skipped()) / double(scaler->steps_seen()) : 0.0;
    result.scaler = {{"skipped", scaler->skipped()}, {"steps", scaler->steps_seen()},
                     {"skipped_share", share}, {"final_scale", scaler->scale()},
                     {"skipped_steps", scaler->skipped_steps()}};
    if (share > config.precision.max_skipped_share)
      parts.decisions.record("grad_scaler_skipped", fmt::format("{} of {} steps ({:.1f}%)",
                                                                scaler->skipped(),
                                                                scaler->steps_seen(), 100 * share),
                             fmt::format("more than precision.max_skipped_share = {:g}: those steps "
                                         "trained nothing; raise precision.init_scale's headroom "
                                         "(lower it) or find the overflow "
                                         "(precision.check_overflow = true)",
                                         config.precision.max_skipped_share),
                             /*warn=*/true);
  }
  result.allreduce_hidden_share = reducer.hidden_share();
  if (!step_times.empty()) {
    std::nth_element(step_times.begin(), step_times.begin() + long(step_times.size() / 2), step_times.end());
    result.step_s_median = step_times[step_times.size() / 2];
  }
  {
    auto scope = timer.measure(Phase::kEval);
    result.last_eval = evaluate(model, parts.data.test, parts.rank, parts.world_size,
                                config.eval.batch_size, parts.data_group, parts.precision);
  }
  parts.events.write({{"event", "eval"}, {"step", steps}, {"loss", result.last_eval.loss},
                      {"accuracy", result.last_eval.accuracy}});
  return result;
}

}  // namespace lockstep

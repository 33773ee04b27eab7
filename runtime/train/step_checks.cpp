// The arithmetic checks of the step loop (runtime/audit/cross_check.h,
// step_evidence.h): the cross-checks' set-up, the recomputation of another
// rank's microbatch, what a mismatch does, the digest of a step's state.
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "runtime/audit/seeding.h"
#include "runtime/model/digest.h"
#include "runtime/train/recompute.h"
#include "runtime/train/step_loop.h"

namespace lockstep::train_internal {

void StepLoop::set_up_cross_checks() {
  const AuditSection& audit = config_.audit;
  const auto source = config_.sources.find("audit.verify_every");
  const bool by_default = source == config_.sources.end() || source->second == "default";
  auto off = [&](const std::string& why, bool warn) {
    parts_.decisions.record("audit.verify_every", "off", why, warn);
  };
  if (audit.verify_every == 0)
    return off("audit.verify_every = 0: a rank that computes a wrong gradient goes unnoticed during the run "
               "(every rank agrees on the wrong sum); `lockstep verify RUN_DIR` can replay the steps afterwards",
               /*warn=*/true);
  if (parts_.world_size < 2)
    return off("one rank: no other rank to compute its microbatches again; `lockstep verify RUN_DIR` replays "
               "them afterwards", /*warn=*/false);
  if (config_.comm.summation != "exact")
    return off("comm.summation = float: a microbatch's gradient is summed into the others' as it is computed, "
               "so there is none to compare, and its bits depend on the rank (exact summation keeps both)",
               /*warn=*/true);
  if (!parts_.control) return;
  std::vector<std::string> names;
  for (const auto& [name, p] : parameters_) names.push_back(name);
  std::vector<std::string> hosts = parts_.hosts;
  for (int r = int(hosts.size()); r < parts_.world_size; ++r) hosts.push_back("host of rank " + std::to_string(r));
  checker_.emplace(*parts_.control, parts_.rank, parts_.world_size, config_.train.accum_steps, audit.verify_every,
                   hosts, names);
  const double share = 100.0 / double(audit.verify_every * config_.train.accum_steps);
  parts_.decisions.record(
      "audit.verify_every", std::to_string(audit.verify_every),
      fmt::format("{}every {} steps each rank computes again one microbatch that another rank computed (the "
                  "checker and the microbatch rotate) and the digests of their gradients and losses are "
                  "compared: about {:.3g}% more compute with {} microbatch(es) per rank; a mismatch: "
                  "audit.on_miscompute = {}",
                  by_default ? "the default: in tests/bench/verify_cost.py the checks took 0.9% of the cnn's "
                               "training time and 0.7% of the scripted resnet18's (2 ranks, a microbatch each; every "
                               "10 steps: +7.3% and +6.0% step time); " : "",
                  audit.verify_every, share, config_.train.accum_steps, audit.on_miscompute),
      /*warn=*/false);
  // A step a new generation computes again (after a lost rank or an
  // excluded host) is checked whatever the schedule.
  if (parts_.resume || parts_.resume_in_memory) checker_->also_check(first_step_ + 1);
}

std::vector<Miscompute> StepLoop::cross_check(int64_t step, const MicrobatchDigest& own,
                                              const std::vector<at::Tensor>& own_gradients) {
  auto scope = parts_.timer.measure(Phase::kAudit);
  const int64_t j = checker_->to_recompute(step + 1);
  Batch batch = batches_->assemble_at(step, j);
  batch.inputs = batch.inputs.to(device_);
  batch.targets = batch.targets.to(device_);
  const uint64_t seed = config_.test.no_reseed ? uint64_t(config_.job.seed)
                                               : microbatch_seed(uint64_t(config_.job.seed), step, j);
  Recomputed again;
  faults_->set_quiet(true);  // computed as a healthy rank would
  try {
    buffers_->aside([&] {
      model_call("the recomputation of another rank's microbatch", step + 1, [&] {
        again = recompute_microbatch(model_, *objective_, parameters_, batch, step + 1, seed, autocast_,
                                     scaler_ ? scaler_->scale() : 1.0);
      });
    });
  } catch (...) {
    faults_->set_quiet(false);
    throw;
  }
  faults_->set_quiet(false);
  ++result_.cross_checks;
  std::vector<Miscompute> found = checker_->compare(own, own_gradients, again.digest, again.gradients);
  parts_.events.write({{"event", "cross_check"}, {"step", step + 1}, {"recomputed_microbatch", j},
                       {"own_microbatch_checked", own.index}, {"agreed", found.empty()}});
  return found;
}

void StepLoop::act_on_miscompute(const std::vector<Miscompute>& found) {
  result_.miscomputes += int64_t(found.size());
  std::string what;
  for (const auto& m : found) {
    parts_.events.write({{"event", "miscompute"}, {"step", m.step}, {"microbatch", m.microbatch},
                         {"owner", m.owner}, {"owner_host", m.owner_host}, {"checker", m.checker},
                         {"checker_host", m.checker_host}, {"loss_differs", m.loss_differs},
                         {"tensors", m.tensors}, {"policy", config_.audit.on_miscompute}});
    what += (what.empty() ? "" : "; ") + m.describe();
  }
  const std::string& policy = config_.audit.on_miscompute;
  const Miscompute& first = found.front();
  if (policy == "warn") {
    if (parts_.rank == 0)
      spdlog::error("{} (audit.on_miscompute = warn: the step goes on with that sum; `lockstep verify` names it "
                    "afterwards)", what);
    return;
  }
  if (policy == "fail")
    throw RunError(what + " (audit.on_miscompute = fail: the job stops before the step is applied; take host " +
                   first.owner_host + " out of the job, or let an elastic job go on without it: "
                   "audit.on_miscompute = exclude)");
  throw MiscomputeExcluded(what + "; audit.on_miscompute = exclude: the job goes on without host " +
                               first.owner_host + ", from the state before step " + std::to_string(first.step) +
                               ", which it computes and checks again",
                           first.owner_host, first.owner);
}

StateDigest StepLoop::state_digest() const {
  StateDigest state{bits_digest(reducer_.flat().first).hex(), ""};
  NamedDigests buffers;
  for (const auto& [name, buffer] : model_.buffers()) buffers.emplace_back(name, bits_digest(buffer));
  if (!buffers.empty()) state.buffers = combined_hex(buffers);
  return state;
}

}  // namespace lockstep::train_internal

#include "runtime/startup/resume_plan.h"

#include <filesystem>

#include <spdlog/spdlog.h>

#include "runtime/checkpoint/checkpoint_store.h"
#include "runtime/base/errors.h"

namespace lockstep {

// The settings reach every worker as overrides, so a resumed run needs
// nothing repeated on its command line.
ResumePlan plan_resume(const std::string& resume_dir, std::vector<std::string>& overrides) {
  ResumePlan plan;
  if (resume_dir.empty()) return plan;
  std::filesystem::path dir = std::filesystem::absolute(resume_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // a trailing slash
  if (!std::filesystem::is_directory(dir / "checkpoints"))
    throw InputError("--resume " + resume_dir + ": no checkpoints folder in it (give a run folder, "
                     "runs/<run-id>, of a job that ran with checkpoint.every > 0)");
  plan.run_id = dir.filename().string();
  std::vector<std::string> rejected;
  auto found = CheckpointStore((dir / "checkpoints").string()).newest_valid(&rejected);
  if (!found) {  // refused here, before anything starts or writes into the run
    std::string why;
    for (const auto& r : rejected) why += (why.empty() ? "" : "; ") + r;
    throw InputError("--resume " + resume_dir + ": no complete checkpoint that verifies" +
                     (why.empty() ? " (none was written: checkpoint.every = 0?)" : ": " + why));
  }
  plan.step = found->step;
  plan.checkpoint_folder = found->folder;
  plan.meta = found->meta;
  std::vector<std::string> base;
  // The user's --set of either length key replaces both stored ones:
  // exactly one of job.steps and job.epochs may be set.
  bool length_given = false;
  // Likewise the batch keys: the stored global batch and microbatch stay
  // unless the user sets one of the four; the per-rank ones are derived
  // from them again (for the world size of this run).
  bool batch_given = false;
  const auto is_batch_key = [](const std::string& key) {
    return key == "data.batch_size" || key == "train.accum_steps" || key == "data.global_batch" ||
           key == "data.microbatch";
  };
  for (const auto& item : overrides) {
    length_given |= item.rfind("job.steps=", 0) == 0 || item.rfind("job.epochs=", 0) == 0;
    batch_given |= is_batch_key(item.substr(0, item.find('=')));
  }
  for (const auto& item : found->meta.value("settings", nlohmann::json::array())) {
    if (!item.is_string()) continue;
    const std::string text = item.get<std::string>();
    const std::string key = text.substr(0, text.find('='));
    // test.* switches break one run on purpose; the resume is a new attempt.
    if (key == "job.run_dir" || key == "checkpoint.resume" || key.rfind("test.", 0) == 0) continue;
    if (length_given && (key == "job.steps" || key == "job.epochs")) continue;
    if (is_batch_key(key) && (batch_given || key == "data.batch_size" || key == "train.accum_steps")) continue;
    base.push_back(text);
  }
  spdlog::info("Decision: resume_settings = those stored in the checkpoint of step {} ({} settings), "
               "{} --set on top (a resumed run continues the run it resumes; --set changes it)",
               found->step, base.size(), overrides.size());
  overrides.insert(overrides.begin(), base.begin(), base.end());
  overrides.push_back("job.run_dir=" + dir.parent_path().string());
  overrides.push_back("checkpoint.resume=" + dir.string());
  return plan;
}

bool resume_is_already_done(const ResumePlan& plan, const JobConfig& config) {
  if (plan.run_id.empty() || plan.step < 0) return false;
  // A setting the run must keep, checked before anything starts (the
  // workers check again).
  if (const std::string conflict = resume_conflict(plan.meta, config); !conflict.empty())
    throw InputError("--resume " + plan.checkpoint_folder + ": " + conflict);
  if (config.job.steps <= 0) return false;
  if (plan.step > config.job.steps)
    throw InputError("--resume: the newest checkpoint is at step " + std::to_string(plan.step) +
                     ", past job.steps = " + std::to_string(config.job.steps) + "; to train further " +
                     "give --set job.steps=N with N above " + std::to_string(plan.step));
  if (plan.step < config.job.steps) return false;
  spdlog::info("Decision: resume = nothing to train (run {} is already complete: its newest checkpoint "
               "is step {} = job.steps; give --set job.steps=N above it to train further)",
               plan.run_id, plan.step);
  return true;
}

}  // namespace lockstep

// `lockstep verify RUN_DIR [--steps A:B]`: replays a run's steps on this
// machine, on one rank, from the newest checkpoint at or before A (or the
// run's start), and compares every microbatch's gradient digest and every
// step's state digest with the run's step evidence. Nothing is written into
// RUN_DIR: the replay's own folder is a temporary one, removed after.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "runtime/audit/step_evidence.h"
#include "runtime/base/errors.h"
#include "runtime/base/untrusted_json.h"
#include "runtime/checkpoint/checkpoint_store.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/startup/job_checks.h"
#include "worker/worker.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

struct StepRange {
  int64_t first = 1, last = 0;  // last 0: the last recorded step
};

int64_t parse_step(const std::string& text, const std::string& given) {
  size_t used = 0;
  long long value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || value < 1)
    throw InputError("--steps " + given + ": A:B with whole steps from 1 (either may be left out: 5:, :20)");
  return value;
}

StepRange parse_range(const std::string& text) {
  StepRange range;
  if (text.empty()) return range;
  const auto colon = text.find(':');
  if (colon == std::string::npos) throw InputError("--steps " + text + ": A:B, e.g. --steps 10:20 (one step: 7:7)");
  const std::string a = text.substr(0, colon), b = text.substr(colon + 1);
  if (!a.empty()) range.first = parse_step(a, text);
  if (!b.empty()) range.last = parse_step(b, text);
  if (range.last > 0 && range.last < range.first)
    throw InputError("--steps " + text + ": the first step is after the last");
  return range;
}

struct RecordedRun {
  std::vector<std::string> settings;  // as --set overrides
  std::string buffers;                // the `buffers` decision's value: mean ..., none ..., broadcast ...
};

// The run's settings and buffer policy, from its manifest (bounded, checked).
RecordedRun recorded_run(const std::string& run_dir) {
  const std::string path = run_dir + "/manifest.json";
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode))
    throw InputError(path + ": missing or not a file (is " + run_dir + " a run folder?)");
  std::ifstream in(path);
  std::string why;
  const nlohmann::json manifest = parse_untrusted_json(in, &why);
  if (manifest.is_discarded() || !manifest.is_object())
    throw InputError(path + ": not a lockstep manifest (" + (why.empty() ? "not an object" : why) + ")");
  auto settings = manifest.find("settings");
  if (settings == manifest.end() || !settings->is_array() || settings->size() > 10000)
    throw InputError(path + ": no settings list (a run recorded before `lockstep verify` existed cannot be replayed)");
  RecordedRun out;
  for (const auto& item : *settings) {
    if (!item.is_string() || item.get_ref<const std::string&>().size() > 100000 ||
        item.get_ref<const std::string&>().find('=') == std::string::npos)
      throw InputError(path + ": a setting is not KEY=VALUE text");
    out.settings.push_back(item.get<std::string>());
  }
  if (auto decisions = manifest.find("decisions"); decisions != manifest.end() && decisions->is_array())
    for (const auto& d : *decisions)
      if (d.is_object() && d.contains("what") && d["what"].is_string() && d["what"].get<std::string>() == "buffers" &&
          d.contains("value") && d["value"].is_string())
        out.buffers = d["value"].get<std::string>().substr(0, 200);
  return out;
}

std::string setting_value(const std::vector<std::string>& settings, const std::string& key) {
  for (const auto& s : settings)
    if (s.rfind(key + "=", 0) == 0) return s.substr(key.size() + 1);
  return "";
}

// What the replay changes: one rank, the run's threads, nothing written
// into the run, no faults, no checks that need other ranks.
std::vector<std::string> replay_overrides(const std::vector<std::string>& settings, const std::string& folder,
                                          int threads) {
  static const std::set<std::string> dropped = {
      "job.run_dir", "job.world_size", "job.threads_per_rank", "data.batch_size", "train.accum_steps",
      "fault.inject", "eval.every", "checkpoint.every", "checkpoint.resume"};
  std::vector<std::string> out;
  for (const auto& s : settings) {
    const std::string key = s.substr(0, s.find('='));
    if (dropped.count(key) || key.rfind("test.", 0) == 0 || key.rfind("elastic.", 0) == 0 ||
        key.rfind("audit.", 0) == 0)
      continue;
    out.push_back(s);
  }
  for (const std::string& s : std::vector<std::string>{"job.world_size=1", "job.run_dir=" + folder, "eval.every=0", "checkpoint.every=0",
                               "audit.every=0", "audit.verify_every=0", "job.name=verify"})
    out.push_back(s);
  if (threads > 0) out.push_back("job.threads_per_rank=" + std::to_string(threads));
  return out;
}

class TemporaryFolder {
 public:
  TemporaryFolder() {
    std::string pattern = (fs::temp_directory_path() / "lockstep-verify-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw RunError("cannot make a temporary folder for the replay in " +
                                                   fs::temp_directory_path().string());
    path_ = pattern;
  }
  ~TemporaryFolder() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

int verify_command(const std::string& run_dir_given, const std::string& steps, bool json) {
  const StepRange asked = parse_range(steps);
  const std::string run_dir = fs::absolute(run_dir_given).lexically_normal().string();
  if (!fs::is_directory(run_dir)) throw InputError(run_dir_given + ": not a folder (give a run folder, runs/<run-id>)");
  const RecordedRun recorded = recorded_run(run_dir);
  const std::vector<std::string>& settings = recorded.settings;
  // Buffers kept the same at any world size (mean), or none: compared. Any
  // other policy ties them to the run's world size: the parameters and
  // every microbatch are still compared.
  const bool buffers_compared = recorded.buffers.empty() || recorded.buffers.rfind("mean", 0) == 0 ||
                                recorded.buffers.rfind("none", 0) == 0;
  if (setting_value(settings, "comm.summation") != "exact")
    throw InputError(run_dir + " ran with comm.summation = " + setting_value(settings, "comm.summation") +
                     ": its sums depend on the world size and on which rank computed what, so no replay can "
                     "reproduce its bits (comm.summation = exact, the default, can)");
  const RunEvidence evidence = read_run_evidence(run_dir);
  if (evidence.steps.empty())
    throw InputError(run_dir + ": no step evidence (step-evidence-rank*.jsonl): the run recorded none");
  const int64_t recorded_last = evidence.steps.rbegin()->first;
  StepRange range = asked;
  if (range.last == 0) range.last = recorded_last;
  if (range.first > recorded_last)
    throw InputError(fmt::format("--steps {}: the run's evidence ends at step {}", steps, recorded_last));
  range.last = std::min(range.last, recorded_last);

  // Every microbatch of every step in the range must have been recorded by someone.
  int64_t per_step = 0;
  try {
    per_step = std::stoll(setting_value(settings, "data.global_batch")) /
               std::stoll(setting_value(settings, "data.microbatch"));
  } catch (const std::exception&) {
    throw InputError(run_dir + "/manifest.json: settings without data.global_batch and data.microbatch");
  }
  std::set<int> ranks_seen, worlds_seen, threads_seen;
  std::set<int64_t> generations_seen;
  int64_t digests_recorded = 0;
  std::string missing;
  for (int64_t step = range.first; step <= range.last && missing.empty(); ++step) {
    auto records = evidence.steps.find(step);
    std::set<int64_t> indices;
    if (records != evidence.steps.end())
      for (const auto& r : records->second) {
        for (const auto& [index, digest] : r.microbatches) indices.insert(index);
        digests_recorded += int64_t(r.microbatches.size());
        worlds_seen.insert(r.world_size);
        generations_seen.insert(r.generation);
        if (r.threads > 0) threads_seen.insert(r.threads);
      }
    for (int64_t j = 0; j < per_step && missing.empty(); ++j)
      if (!indices.count(j)) missing = fmt::format("step {}, microbatch {}", step, j);
  }
  const int threads = threads_seen.empty() ? 0 : *threads_seen.begin();
  if (threads_seen.size() > 1 && !json)
    spdlog::warn("lockstep verify: the run's ranks used {} to {} intra-op threads (a generation on fewer ranks "
                 "per host gets more); the replay uses {}: kernels sum in an order set by the thread count, so "
                 "steps computed with another may differ (job.threads_per_rank fixes it for a run)",
                 *threads_seen.begin(), *threads_seen.rbegin(), threads);
  nlohmann::json report = {{"run_dir", run_dir}, {"steps", {range.first, range.last}}};
  if (!missing.empty()) {
    report["verified"] = false;
    report["error"] = "no evidence for " + missing;
    if (json) std::printf("%s\n", report.dump(2).c_str());
    else
      spdlog::error("lockstep verify: {}: no evidence for {} (a rank's step-evidence file is missing or cut "
                    "short): those steps cannot be verified", run_dir, missing);
    return 1;
  }

  TemporaryFolder folder;
  std::vector<std::string> overrides = replay_overrides(settings, folder.path(), threads);
  CheckpointStore store(run_dir + "/checkpoints");
  std::vector<std::string> rejected;
  const auto start_checkpoint = fs::is_directory(run_dir + "/checkpoints")
                                    ? store.newest_valid(&rejected, range.first - 1)
                                    : std::nullopt;
  if (start_checkpoint) overrides.push_back("checkpoint.resume=" + run_dir);
  const std::string from = start_checkpoint ? fmt::format("the checkpoint of step {}", start_checkpoint->step)
                                            : std::string("the run's start");
  const std::string empty_job = folder.path() + "/job.toml";
  std::ofstream(empty_job) << "# the recorded run's settings come as overrides\n";

  const auto level = spdlog::get_level();
  if (!json)
    spdlog::info("lockstep verify: steps {} to {} of {} ({} microbatch digests recorded by {} over {} "
                 "generation(s)); replaying them on this machine, 1 rank{}, from {}",
                 range.first, range.last, run_dir, digests_recorded,
                 worlds_seen.size() == 1 ? fmt::format("{} rank(s)", *worlds_seen.begin())
                                         : fmt::format("{} to {} ranks", *worlds_seen.begin(), *worlds_seen.rbegin()),
                 generations_seen.size(), threads > 0 ? fmt::format(", {} thread(s) as recorded", threads) : "", from);
  if (!buffers_compared && !json)
    spdlog::info("lockstep verify: the buffers are not compared: the run kept them with comm.buffers = {}, which "
                 "ties them to its world size (comm.buffers = mean keeps them the same on any); the parameters "
                 "and every microbatch are", recorded.buffers);
  ReplayCheck check(evidence, range.first, range.last, buffers_compared);
  const auto started = std::chrono::steady_clock::now();
  std::optional<ReplayMismatch> mismatch;
  spdlog::set_level(spdlog::level::err);  // the replay's own start-up lines are not the story
  try {
    JobConfig config = checked_job(empty_job, overrides);
    check_devices_here(config);
    SingleProcessRendezvous rendezvous;
    WorkerOptions options;
    options.replay = &check;
    options.resume_at_most = range.first - 1;
    options.terminal = !json && ::isatty(STDOUT_FILENO);
    options.cpu = CpuBudget::of_this_process();
    run_worker(config, rendezvous, ModelRegistry::with_builtins(), options);
  } catch (const ReplayMismatch& e) {
    mismatch = e;
  } catch (...) {
    spdlog::set_level(level);
    throw;
  }
  spdlog::set_level(level);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  report["from"] = from;
  report["seconds"] = seconds;
  report["steps_checked"] = check.steps_checked();
  report["microbatch_digests_checked"] = check.microbatches_checked();
  report["state_digests_checked"] = check.states_checked();
  report["buffers_compared"] = buffers_compared;
  report["verified"] = !mismatch;
  if (mismatch) {
    report["first_difference"] = {{"step", mismatch->step}, {"microbatch", mismatch->microbatch},
                                  {"rank", mismatch->rank}, {"what", mismatch->what()}};
    if (json) std::printf("%s\n", report.dump(2).c_str());
    else
      spdlog::error("lockstep verify: DIFFERS at {} (replayed from {}; {} step(s) before it matched, {} microbatch "
                    "and {} state digest(s) compared, {:.1f} s)",
                    mismatch->what(), from, check.steps_checked(), check.microbatches_checked(),
                    check.states_checked(), seconds);
    return 1;
  }
  if (check.steps_checked() < range.last - range.first + 1)
    throw RunError(fmt::format("the replay ended after {} of the {} steps asked for; nothing differed until then",
                               check.steps_checked(), range.last - range.first + 1));
  if (json) std::printf("%s\n", report.dump(2).c_str());
  else
    spdlog::info("lockstep verify: VERIFIED steps {} to {}: {} steps, {} microbatch digests and {} state digests "
                 "equal to the run's evidence (replayed on 1 rank from {}, {:.1f} s)",
                 range.first, range.last, check.steps_checked(), check.microbatches_checked(),
                 check.states_checked(), from, seconds);
  return 0;
}

}  // namespace lockstep

// The small commands a person uses around a job: --version, config (the
// effective configuration, read back to the same), keys.
#include <filesystem>
#include <csignal>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "integration/jobs.h"
#include "lockstep/build_config.h"
#include "runtime/job/config.h"

namespace lockstep::testing {
namespace {

// The run folder under `runs` of a `lockstep run` job once it can be found
// from there (its coordinator address is written); "" after 30 s.
std::string running_folder(const std::string& runs) {
  for (int i = 0; i < 300; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::error_code missing;
    for (const auto& entry : std::filesystem::directory_iterator(runs, missing))
      if (std::filesystem::exists(entry.path() / "coordinator-address")) return entry.path();
  }
  return "";
}

TEST(Commands, VersionConfigThatReadsBackAndKeys) {
  TempDir dir;
  auto version = run_lockstep({"--version"}, dir.path(), 30);
  EXPECT_EQ(version.exit_code, 0) << version.output;
  EXPECT_NE(version.output.find("lockstep " LOCKSTEP_VERSION), std::string::npos) << version.output;
  // The LibTorch it links and whether CUDA and the NCCL data group are in,
  // as the configure step said it.
  EXPECT_NE(version.output.find("(LibTorch " LOCKSTEP_TORCH_VERSION ", "), std::string::npos) << version.output;
  std::ifstream summary_file(LOCKSTEP_CONFIGURE_SUMMARY_FILE);
  std::string configured;
  std::getline(summary_file, configured);
  EXPECT_EQ(configured, std::string("lockstep: LibTorch " LOCKSTEP_TORCH_VERSION) +
                            (LOCKSTEP_HAS_CUDA ? " with CUDA: NCCL data group compiled in"
                                               : " is CPU-only: NCCL data group compiled out, device=gpu will be refused"));
  EXPECT_NE(version.output.find(LOCKSTEP_HAS_CUDA ? "CUDA, NCCL data group compiled in" : "no NCCL"), std::string::npos)
      << version.output;

  const std::string job = examples_dir() + "/fashion_mnist_cnn.toml";
  auto printed = run_lockstep({"config", job, "--set", "optim.lr=0.125", "--set", "data.augment=hflip"}, dir.path(), 30);
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  EXPECT_NE(printed.output.find("\nlr = 0.125  # --set\n"), std::string::npos) << printed.output;
  EXPECT_NE(printed.output.find("\nname = \"cnn\"  # " + job + "\n"), std::string::npos) << printed.output;
  const std::string effective = dir.path() + "/effective.toml";
  std::ofstream(effective) << printed.output;
  // Read back, the printed file is the same job.
  auto original = run_lockstep({"config", job, "--set", "optim.lr=0.125", "--set", "data.augment=hflip", "--json"},
                               dir.path(), 30);
  auto again = run_lockstep({"config", effective, "--json"}, dir.path(), 30);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(nlohmann::json::parse(again.output)["config"], nlohmann::json::parse(original.output)["config"]);
  EXPECT_EQ(nlohmann::json::parse(original.output)["sources"]["optim.lr"], "--set");

  auto bad = run_lockstep({"config", job, "--set", "optim.lrr=1"}, dir.path(), 30);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("optim.lr"), std::string::npos) << "a did-you-mean: " << bad.output;

  auto keys = run_lockstep({"keys", "--json"}, dir.path(), 30);
  ASSERT_EQ(keys.exit_code, 0) << keys.output;
  const auto listed = nlohmann::json::parse(keys.output);
  EXPECT_EQ(listed.size(), known_keys().size());
  bool found = false;
  for (const auto& k : listed)
    if (k["key"] == "data.bad_files") {
      found = true;
      EXPECT_EQ(k["default"], "\"error\"");
      EXPECT_EQ(k["allowed"], "one of: error, skip");
    }
  EXPECT_TRUE(found);
}

// `lockstep status RUN_DIR` on a `lockstep run` job: no token to export, no
// port to look up; after the job, the manifest's outcome.
TEST(Commands, StatusFindsALockstepRunJobFromItsFolder) {
  TempDir dir;
  LockstepProcess job(synthetic_run(dir, 2, {"job.steps=100000", "job.name=watched"}), dir.path());
  const std::string run = running_folder(dir.path() + "/runs");
  ASSERT_FALSE(run.empty()) << job.output();
  EXPECT_EQ(std::filesystem::status(run + "/.token").permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  std::string table;
  for (int i = 0; i < 100 && table.find("running") == std::string::npos; ++i) {
    table = run_lockstep({"status", run}, dir.path(), 15).output;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(table.find("run watched-"), std::string::npos) << table;
  EXPECT_NE(table.find(": running"), std::string::npos) << table;
  EXPECT_NE(table.find("rank  host"), std::string::npos) << table;
  // The pace needs two heartbeats in training.
  for (int i = 0; i < 100 && (table.find("ETA ") == std::string::npos ||
                              table.find("ETA not yet known") != std::string::npos); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    table = run_lockstep({"status", run}, dir.path(), 15).output;
  }
  EXPECT_NE(table.find(" of 100000 ("), std::string::npos) << table;
  EXPECT_NE(table.find("ETA "), std::string::npos) << table;
  EXPECT_EQ(table.find("ETA not yet known"), std::string::npos) << table;
  job.signal(SIGINT);
  EXPECT_EQ(job.wait(60), 1) << job.output();
  EXPECT_FALSE(std::filesystem::exists(run + "/.token")) << "the token stays only while the job runs";
  auto after = run_lockstep({"status", run}, dir.path(), 15);
  EXPECT_EQ(after.exit_code, 0) << after.output;
  EXPECT_NE(after.output.find("cancelled, not running"), std::string::npos) << after.output;
  auto nowhere = run_lockstep({"status", dir.path()}, dir.path(), 15);
  EXPECT_EQ(nowhere.exit_code, 2) << nowhere.output;
  EXPECT_NE(nowhere.output.find("not a run folder"), std::string::npos) << nowhere.output;
}

// --watch prints again every second and returns by itself when the job ends.
TEST(Commands, StatusWatchFollowsAJobToItsEnd) {
  TempDir dir;
  LockstepProcess job(synthetic_run(dir, 2, {"job.steps=1500", "job.name=followed"}), dir.path());
  const std::string run = running_folder(dir.path() + "/runs");
  ASSERT_FALSE(run.empty()) << job.output();
  auto watched = run_lockstep({"status", run, "--watch"}, dir.path(), 120);
  EXPECT_EQ(watched.exit_code, 0) << watched.output;
  EXPECT_EQ(job.wait(60), 0) << job.output();
  size_t tables = 0;
  for (size_t at = 0; (at = watched.output.find("rank  host", at)) != std::string::npos; ++at) ++tables;
  EXPECT_GE(tables, 2u) << watched.output;
  EXPECT_TRUE(watched.output.find(": completed") != std::string::npos ||
              watched.output.find("is gone: the job has ended") != std::string::npos)
      << watched.output;
}

}  // namespace
}  // namespace lockstep::testing

namespace lockstep::testing {
namespace {

// Lines of `output` a rank printed ("[rank N] ...") that hold `text`.
std::vector<std::string> rank_lines(const std::string& output, int rank, const std::string& text) {
  std::vector<std::string> out;
  std::istringstream lines(output);
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(prefix, 0) == 0 && line.find(text) != std::string::npos) out.push_back(line);
  return out;
}

TEST(Commands, EachDecisionIsPrintedOnceWithTheRanksItHoldsForAndQuietPrintsNone) {
  TempDir dir;
  auto run = run_lockstep(synthetic_run(dir, 4, {"job.steps=10"}), dir.path(), 150);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto rank0 = rank_lines(run.output, 0, "Decision: ");
  size_t all = rank0.size();
  for (int rank = 1; rank < 4; ++rank) {
    const auto own = rank_lines(run.output, rank, "Decision: ");
    all += own.size();
    // Only where a rank differs from rank 0; the random streams are the
    // microbatches' now, so no rank decides anything of its own.
    EXPECT_EQ(own.size(), 0u) << "rank " << rank << ":\n" << run.output;
  }
  std::cout << "decision lines from 4 ranks: " << all << " (rank 0: " << rank0.size() << ")" << std::endl;
  // One line per decision for the job (27 with the arithmetic probe and the cross-checks'), not one per rank.
  EXPECT_LE(all, 28u) << run.output;
  EXPECT_EQ(rank_lines(run.output, 0, "Decision: device = cpu (").size(), 1u) << run.output;
  EXPECT_EQ(rank_lines(run.output, 0, "[all 4 ranks]").size(), rank0.size()) << run.output;
  EXPECT_EQ(rank_lines(run.output, 0, "Decision: train_seed = per microbatch (every generator is seeded from "
                                      "(job.seed, step, microbatch index)").size(), 1u) << run.output;
  // Every rank's events still hold all of its own decisions.
  const std::string folder = single_run(dir.path() + "/runs");
  for (int rank = 0; rank < 4; ++rank) {
    int decisions = 0;
    for (const auto& e : read_json_lines(folder + "/events-rank" + std::to_string(rank) + ".jsonl"))
      decisions += e["event"] == "decision";
    EXPECT_GE(decisions, 10) << "rank " << rank;
  }

  // --quiet: warnings and errors only; the run is the same.
  TempDir quiet_dir;
  std::vector<std::string> quiet = synthetic_run(quiet_dir, 2, {"job.steps=10"});
  quiet.insert(quiet.begin() + 1, "--quiet");
  auto silent = run_lockstep(quiet, quiet_dir.path(), 150);
  ASSERT_EQ(silent.exit_code, 0) << silent.output;
  EXPECT_EQ(silent.output.find("Decision: "), std::string::npos) << silent.output;
  EXPECT_EQ(silent.output.find(" info "), std::string::npos) << silent.output;
  auto manifest = read_json(single_run(quiet_dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "completed");
  EXPECT_GE(manifest["decisions"].size(), 10u);
  // A warning still shows: audit.every = 0 is one.
  std::vector<std::string> warned = synthetic_run(quiet_dir, 2, {"job.steps=10", "audit.every=0"});
  warned.insert(warned.begin() + 1, "--quiet");
  auto warning = run_lockstep(warned, quiet_dir.path(), 150);
  ASSERT_EQ(warning.exit_code, 0) << warning.output;
  EXPECT_NE(warning.output.find("Decision: audit = off"), std::string::npos) << warning.output;
}

// The synthetic example as shipped (2 ranks, 40 steps) learns: its test
// accuracy is well above chance (0.10) and its logged loss falls.
TEST(Commands, TheSyntheticExampleLearnsSomethingVisible) {
  TempDir dir;
  auto run = run_lockstep(synthetic_run(dir, 2, {}), dir.path(), 150);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string folder = single_run(dir.path() + "/runs");
  auto manifest = read_json(folder + "/manifest.json");
  const double accuracy = manifest["metrics"]["test_accuracy"].get<double>();
  EXPECT_GE(accuracy, 0.4) << "chance is 0.10";
  std::vector<double> losses;
  for (const auto& e : read_json_lines(folder + "/events-rank0.jsonl"))
    if (e["event"] == "step") losses.push_back(e["loss"].get<double>());
  ASSERT_GE(losses.size(), 2u);
  EXPECT_LT(losses.back(), losses.front() - 0.1);
  std::printf("synthetic example: test accuracy %.3f, loss %.3f at the first logged step, %.3f at the last\n",
              accuracy, losses.front(), losses.back());
}

}  // namespace
}  // namespace lockstep::testing

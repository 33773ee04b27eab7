// Signals to a standalone coordinator and its workers, as a scheduler sends
// them: SIGTERM ends the job (failed, manifest written, workers told);
// SIGUSR1 (Slurm's warning before the time limit), to the coordinator or to
// any one worker, stops every rank after the same step with a checkpoint
// there; resuming from it ends with the uninterrupted run's parameters.
#include <csignal>
#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "integration/cluster.h"

namespace lockstep::testing {
namespace {

const std::vector<std::string> kStoppable = {"job.steps=1500", "checkpoint.every=1000",
                                             "fault.heartbeat_s=0.2", "job.threads_per_rank=1"};

TEST(Signals, SigtermToTheCoordinatorFailsTheJobAndWritesItsManifest) {
  TempDir dir;
  Cluster cluster(dir, {"job.steps=100000", "fault.heartbeat_s=0.2"});
  auto& w0 = cluster.add_worker();
  auto& w1 = cluster.add_worker();
  ASSERT_TRUE(cluster.wait_for_steps(5, 60)) << cluster.coordinator->output();
  cluster.coordinator->signal(SIGTERM);
  EXPECT_EQ(cluster.coordinator->wait(30), 1) << cluster.coordinator->output();
  EXPECT_NE(w0.wait(30), 0) << w0.output();
  EXPECT_NE(w1.wait(30), 0) << w1.output();
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "cancelled");
  EXPECT_NE(manifest.value("error", "").find("cancelled: the coordinator received signal 15 (Terminated)"),
            std::string::npos)
      << manifest.dump(2);
}

TEST(Signals, CtrlCOnRunIsRecordedAsCancelledBySigint) {
  TempDir dir;
  LockstepProcess run(synthetic_run(dir, 2, {"job.steps=100000", "fault.heartbeat_s=0.2"}), dir.path());
  ASSERT_TRUE(run.wait_for_output("step 20/", 60)) << run.output();
  run.signal(SIGINT);
  EXPECT_EQ(run.wait(30), 1) << run.output();
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "cancelled") << manifest.dump(2);
  EXPECT_NE(manifest.value("error", "").find("cancelled: lockstep run received signal 2 (Interrupt, Ctrl-C)"),
            std::string::npos) << manifest.dump(2);
  EXPECT_EQ(run.output().find("a worker process failed"), std::string::npos) << run.output();
}

TEST(Signals, Usr1ToRunStopsTheJobAtACheckpointWithExit75) {
  TempDir dir;
  LockstepProcess run(synthetic_run(dir, 2, {"job.steps=100000", "checkpoint.every=200", "fault.heartbeat_s=0.2",
                                             "job.threads_per_rank=1"}),
                      dir.path());
  ASSERT_TRUE(run.wait_for_output("step 20/", 60)) << run.output();
  run.signal(SIGUSR1);
  EXPECT_EQ(run.wait(60), 75) << "SIGUSR1's default action kills the launcher (138)\n" << run.output();
  const std::string folder = single_run(dir.path() + "/runs");
  auto manifest = read_json(folder + "/manifest.json");
  EXPECT_EQ(manifest["status"], "stopped") << manifest.dump(2);
  EXPECT_EQ(manifest.value("stop_reason", ""), "lockstep run received SIGUSR1") << manifest.dump(2);
  const int64_t step = manifest.value("stopped_at_step", int64_t(0));
  EXPECT_GT(step, 0);
  EXPECT_TRUE(std::filesystem::exists(folder + "/checkpoints/" + fmt::format("step-{:09d}", step) + "/index.json"))
      << run.output();
}

// The step both ranks stopped after; checks the exit codes, the manifest
// and the checkpoint there.
int64_t expect_stopped(Cluster& cluster, const std::string& run) {
  EXPECT_EQ(cluster.coordinator->wait(60), 75) << cluster.coordinator->output();
  for (auto& w : cluster.workers) EXPECT_EQ(w->wait(30), 0) << "a stopped rank did what it was asked: " << w->output();
  auto manifest = read_json(run + "/manifest.json");
  EXPECT_EQ(manifest["status"], "stopped") << manifest.dump(2);
  const int64_t step = manifest.value("stopped_at_step", int64_t(0));
  EXPECT_GT(step, 0);
  EXPECT_LT(step, 1500) << "the run ended before the stop: make it longer";
  for (int r = 0; r < 2; ++r) {  // events files grow across resumes: the newest stop
    nlohmann::json newest;
    for (const auto& e : read_json_lines(run + "/events-rank" + std::to_string(r) + ".jsonl"))
      if (e.value("event", "") == "stopped") newest = e;
    EXPECT_FALSE(newest.is_null()) << "rank " << r;
    EXPECT_EQ(newest["step"], step) << "rank " << r << " stopped after another step";
    EXPECT_EQ(newest["checkpoint"], true);
  }
  EXPECT_TRUE(std::filesystem::exists(run + "/checkpoints/" + fmt::format("step-{:09d}", step) + "/index.json"));
  EXPECT_FALSE(std::filesystem::exists(run + "/model-final.pt")) << "the run is not over";
  return step;
}

TEST(Signals, Usr1StopsEveryRankAtACheckpointAndTheResumedRunEndsWithTheSameDigest) {
  TempDir whole;
  auto uninterrupted = run_lockstep(synthetic_run(whole, 2, kStoppable), whole.path(), 150);
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  const std::string expected = read_json(single_run(whole.path() + "/runs") + "/manifest.json")["metrics"]
                                   .value("final_param_digest", "missing");

  TempDir dir;
  std::string run;
  int64_t first_stop = 0;
  {  // 1. SIGUSR1 to the coordinator.
    Cluster cluster(dir, kStoppable);
    cluster.add_worker();
    cluster.add_worker();
    ASSERT_TRUE(cluster.wait_for_steps(10, 60)) << cluster.coordinator->output();
    cluster.coordinator->signal(SIGUSR1);
    run = single_run(dir.path() + "/runs");
    first_stop = expect_stopped(cluster, run);
    EXPECT_NE(cluster.coordinator->output().find("Decision: stop = after a step every rank agrees on"),
              std::string::npos) << cluster.coordinator->output();
  }
  {  // 2. Resumed there; SIGUSR1 to one worker stops both.
    Cluster cluster(dir, kStoppable, {"--resume", run});
    auto& w0 = cluster.add_worker();
    cluster.add_worker();
    ASSERT_TRUE(cluster.wait_for_steps(first_stop + 10, 60)) << cluster.coordinator->output();
    w0.signal(SIGUSR1);
    const int64_t second_stop = expect_stopped(cluster, run);
    EXPECT_GT(second_stop, first_stop);
    EXPECT_EQ(read_json(run + "/manifest.json")["stop_reason"], "a rank asked (SIGUSR1 to a worker)");
  }
  {  // 3. Resumed again, to the end.
    Cluster cluster(dir, kStoppable, {"--resume", run});
    cluster.add_worker();
    cluster.add_worker();
    ASSERT_EQ(cluster.coordinator->wait(120), 0) << cluster.coordinator->output();
    auto manifest = read_json(run + "/manifest.json");
    EXPECT_EQ(manifest["status"], "completed");
    EXPECT_EQ(manifest["metrics"].value("final_param_digest", "missing"), expected);
  }
}

}  // namespace
}  // namespace lockstep::testing

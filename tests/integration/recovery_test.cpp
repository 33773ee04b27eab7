// Automatic recovery in `lockstep run`: a worker killed (SIGKILL) at a
// random step costs a restart from the newest checkpoint, never the run, and
// the run ends with the parameters of one that was never interrupted; a
// second failure with fault.max_restarts = 1 ends the job, saying the budget
// is spent.
#include <iostream>
#include <random>

#include <gtest/gtest.h>

#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

std::vector<std::string> recoverable_job(const TempDir& dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"job.steps=30", "checkpoint.every=5", "job.log_every=5",
                                   "fault.heartbeat_timeout_s=5"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return synthetic_run(dir, 2, sets);
}

TEST(Recovery, KilledWorkerCostsARestartNotTheRun) {
  std::random_device random;
  const int rank = int(random() % 2);
  const int step = 3 + int(random() % 25);
  std::cout << "killing rank " << rank << " at step " << step << std::endl;
  RecordProperty("killed_rank", rank);
  RecordProperty("killed_step", step);

  TempDir whole, broken;
  auto uninterrupted = run_lockstep(recoverable_job(whole), whole.path(), 150);
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  auto expected = read_json(single_run(whole.path() + "/runs") + "/manifest.json");

  auto recovered = run_lockstep(
      recoverable_job(broken, {"fault.max_restarts=2", "test.fail_rank=" + std::to_string(rank),
                               "test.fail_step=" + std::to_string(step), "test.fail_kind=kill"}),
      broken.path(), 170);
  ASSERT_EQ(recovered.exit_code, 0) << recovered.output;
  EXPECT_NE(recovered.output.find("Decision: restart = generation 1 (rank " + std::to_string(rank) +
                                  " was killed by signal 9"), std::string::npos) << recovered.output;
  auto manifest = read_json(single_run(broken.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "completed");
  EXPECT_EQ(manifest["coordinator"]["generation"], 2) << manifest["coordinator"].dump(2);
  EXPECT_EQ(manifest["metrics"]["final_param_digest"], expected["metrics"]["final_param_digest"]);
  ASSERT_EQ(manifest["restart_count"], 1) << manifest.dump(2);
  const auto& restart = manifest["restarts"][0];
  EXPECT_EQ(restart["dead_rank"], rank);
  EXPECT_EQ(restart["resumed_from_step"], step / 5 * 5);
  ASSERT_TRUE(restart.contains("recovery_s")) << restart.dump();
  EXPECT_GT(restart["recovery_s"].get<double>(), 0.0);
  std::cout << "recovery " << restart["recovery_s"].get<double>() << " s, "
            << step - restart["resumed_from_step"].get<int>() << " steps redone" << std::endl;
}

TEST(Recovery, ASecondFailureWithOneRestartAllowedEndsTheJob) {
  TempDir dir;
  auto result = run_lockstep(
      recoverable_job(dir, {"fault.max_restarts=1", "test.fail_rank=1", "test.fail_step=7",
                            "test.fail_kind=exit", "test.fail_generations=2"}),
      dir.path(), 170);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("Decision: restart = generation 1"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("generation 2 ("), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("the restart budget is spent (fault.max_restarts = 1)"),
            std::string::npos) << result.output;
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["restart_count"], 1);
  EXPECT_NE(manifest["final_failure"].get<std::string>().find("rank 1"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::testing

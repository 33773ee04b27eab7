// Failure paths with real processes: a held-back rank at a control-group
// barrier, a rank that dies, a non-finite loss. Each must end the whole run
// quickly, with an exit code and a message that names the rank.
#include <gtest/gtest.h>

#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

TEST(Failure, BarrierTimeoutNamesTheRankThatDidNotArrive) {
  TempDir dir;
  auto result = run_lockstep(
      synthetic_run(dir, 2, {"test.hold_rank=1", "test.hold_s=30", "comm.barrier_timeout_s=2",
                             "comm.collective_timeout_s=60"}),
      dir.path(), 60);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("control-group barrier 'start' timed out on rank 0"),
            std::string::npos) << result.output;
  EXPECT_NE(result.output.find("rank 1 did not arrive (comm.barrier_timeout_s = 2"),
            std::string::npos) << result.output;
  EXPECT_LT(result.seconds, 25.0) << "the held rank was not stopped";
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "failed");
  EXPECT_NE(manifest["error"].get<std::string>().find("rank 1 did not arrive"), std::string::npos);
}

TEST(Failure, ADeadRankStopsTheOthersAndIsNamed) {
  TempDir dir;
  auto result = run_lockstep(
      synthetic_run(dir, 2, {"fault.max_restarts=0", "test.fail_rank=1", "test.fail_step=3", "comm.collective_timeout_s=60"}),
      dir.path(), 60);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("lockstep run failed: rank 1 exited with status 3"),
            std::string::npos) << result.output;
  EXPECT_LT(result.seconds, 30.0) << "rank 0 was left waiting for its collective timeout";
}

TEST(Failure, NonFiniteLossStopsTheRunNamingStepAndRank) {
  TempDir dir;
  auto result = run_lockstep(
      synthetic_run(dir, 2, {"test.fail_rank=0", "test.fail_step=2", "test.fail_kind=nan_loss"}),
      dir.path(), 60);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("non-finite training loss (nan) at step 2 on rank 0"),
            std::string::npos) << result.output;
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "failed");
}

}  // namespace
}  // namespace lockstep::testing

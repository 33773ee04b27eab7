// Principle 8 end to end: missing targets are masked and counted; a global
// batch without any target makes no update (weight decay and momentum
// would move the parameters otherwise); a run in which no step trained
// fails rather than saying it completed.
#include <gtest/gtest.h>

#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

TEST(MaskedTargets, AllMissingChangesNoParameter) {
  TempDir dir;
  auto result = run_lockstep(
      synthetic_run(dir, 2, {"data.missing_targets=1.0", "job.steps=5", "optim.weight_decay=0.01"}),
      dir.path(), 120);
  ASSERT_EQ(result.exit_code, 1) << result.output;
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "failed");
  EXPECT_NE(manifest.value("error", "").find("no step trained"), std::string::npos) << manifest.dump(2);
  EXPECT_EQ(manifest["metrics"]["skipped_steps"], 5);
  EXPECT_EQ(manifest["metrics"]["final_param_digest"], manifest["checks"]["init_param_digest"]);
  EXPECT_NE(result.output.find("no valid target in the global batch"), std::string::npos);
}

TEST(MaskedTargets, SomeMissingAreCountedAndTrainingGoesOn) {
  TempDir dir;
  auto result = run_lockstep(synthetic_run(dir, 2, {"data.missing_targets=0.3", "job.steps=10"}),
                             dir.path(), 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  int64_t masked = manifest["metrics"]["masked_targets"];
  // Rank 0 saw 10 batches of 32: about 30% of 320 labels are missing.
  EXPECT_GT(masked, 50);
  EXPECT_LT(masked, 150);
  EXPECT_EQ(manifest["metrics"]["skipped_steps"], 0);
  EXPECT_NE(manifest["metrics"]["final_param_digest"], manifest["checks"]["init_param_digest"]);
}

}  // namespace
}  // namespace lockstep::testing

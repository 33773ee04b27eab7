// Principle 4: a shared seed for initialisation, then a stream per microbatch. Both
// halves are checked by lockstep itself; this test reads each rank's own
// evidence from its events file, and turns reseeding off to see that the
// check can fail.
#include <gtest/gtest.h>

#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

struct Seeding {
  std::vector<std::string> init_digests;
  std::vector<std::string> mask_hashes;
  nlohmann::json checks;
  std::string output;
};

Seeding run_seeding(const std::vector<std::string>& extra) {
  TempDir dir;
  std::vector<std::string> sets = {"model.name=cnn", "model.dropout=0.5", "job.steps=3"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  auto result = run_lockstep(synthetic_run(dir, 2, sets), dir.path(), 120);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  std::string run = single_run(dir.path() + "/runs");
  Seeding s;
  s.output = result.output;
  s.checks = read_json(run + "/manifest.json")["checks"];
  for (int r = 0; r < 2; ++r)
    for (const auto& e : read_json_lines(run + "/events-rank" + std::to_string(r) + ".jsonl"))
      if (e["event"] == "seeding") {
        s.init_digests.push_back(e["init_param_digest"]);
        s.mask_hashes.push_back(e["dropout_mask_hash"]);
      }
  EXPECT_EQ(s.init_digests.size(), 2u);
  return s;
}

TEST(Seeding, SameParametersAfterInitDifferentDropoutMasksAfterReseed) {
  Seeding s = run_seeding({});
  ASSERT_EQ(s.mask_hashes.size(), 2u);
  EXPECT_EQ(s.init_digests[0], s.init_digests[1]);
  EXPECT_NE(s.mask_hashes[0], s.mask_hashes[1]);
  EXPECT_EQ(s.checks["init_parameters_identical"], true);
  EXPECT_EQ(s.checks["random_streams_distinct"], true);
  EXPECT_NE(s.output.find("Decision: random_streams = distinct on all 2 ranks"), std::string::npos);
}

TEST(Seeding, WithoutReseedTheCheckSeesEqualMasksAndSaysSo) {
  Seeding s = run_seeding({"test.no_reseed=true"});
  ASSERT_EQ(s.mask_hashes.size(), 2u);
  EXPECT_EQ(s.init_digests[0], s.init_digests[1]);
  EXPECT_EQ(s.mask_hashes[0], s.mask_hashes[1]);
  EXPECT_EQ(s.checks["random_streams_distinct"], false);
  EXPECT_NE(s.output.find("Decision: random_streams = SHARED by ranks 0,1"), std::string::npos)
      << s.output;
}

}  // namespace
}  // namespace lockstep::testing

// The run folder of a real 2-rank run, parsed back: manifest.json with the
// effective configuration, versions, hosts, seeds, decisions and metrics;
// one events file per rank; the final model.
#include <filesystem>

#include <gtest/gtest.h>

#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

bool has_decision(const nlohmann::json& decisions, const std::string& what) {
  for (const auto& d : decisions)
    if (d["what"] == what && !d["reason"].get<std::string>().empty()) return true;
  return false;
}

TEST(RunFolder, ManifestAndEventsDescribeTheRun) {
  TempDir dir;
  auto result = run_lockstep(synthetic_run(dir, 2, {"job.steps=20", "job.log_every=5",
                                                    "eval.every=10"}), dir.path(), 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string run = single_run(dir.path() + "/runs");
  auto m = read_json(run + "/manifest.json");

  EXPECT_EQ(m["status"], "completed");
  EXPECT_EQ(m["run_id"], std::filesystem::path(run).filename().string());
  EXPECT_EQ(m["world_size"], 2);
  EXPECT_EQ(m["config"]["job"]["steps"], 20);
  EXPECT_EQ(m["config"]["data"]["name"], "synthetic");
  EXPECT_EQ(m["config_sources"]["job.steps"], "--set");
  EXPECT_FALSE(m["libtorch_version"].get<std::string>().empty());
  EXPECT_FALSE(m["lockstep_version"].get<std::string>().empty());
  ASSERT_EQ(m["ranks"].size(), 2u);
  EXPECT_FALSE(m["ranks"][1]["host"].get<std::string>().empty());
  EXPECT_EQ(m["seeds"]["init"], 1);
  EXPECT_EQ(m["seeds"]["train_seed_rule"], "per microbatch: (seed, step, microbatch)");
  for (const char* what : {"device", "comm.backend", "precision", "intra_op_threads", "blas",
                           "init_parameters", "random_streams", "gradient_buckets"})
    EXPECT_TRUE(has_decision(m["decisions"], what)) << "no decision for " << what;
  EXPECT_EQ(m["metrics"]["steps"], 20);
  EXPECT_GE(m["metrics"]["test_accuracy"].get<double>(), 0.0);
  EXPECT_LE(m["metrics"]["test_accuracy"].get<double>(), 1.0);
  EXPECT_EQ(m["metrics"]["test_samples"], 256);
  EXPECT_GT(m["phases"]["wall"].get<double>(), 0.0);
  EXPECT_GT(m["phases"]["forward_backward"].get<double>(), 0.0);
  EXPECT_TRUE(std::filesystem::exists(run + "/model-final.pt"));

  for (int rank = 0; rank < 2; ++rank) {
    auto events = read_json_lines(run + "/events-rank" + std::to_string(rank) + ".jsonl");
    int steps = 0, evals = 0, ends = 0;
    for (const auto& e : events) {
      if (e["event"] == "step") {
        ++steps;
        EXPECT_TRUE(e.contains("loss") && e.contains("lr") && e.contains("samples_per_s") &&
                    e.contains("phases")) << e.dump();
      }
      evals += e["event"] == "eval";
      ends += e["event"] == "end";
    }
    EXPECT_EQ(steps, 4) << "rank " << rank;   // every 5 of 20 steps
    EXPECT_EQ(evals, 2) << "rank " << rank;   // step 10 and the end
    EXPECT_EQ(ends, 1) << "rank " << rank;
  }
  EXPECT_NE(result.output.find("time by phase on rank 0"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::testing

// The same job on 1, 2 and 4 ranks with the same global batch: how far the
// parameters drift from the one-rank run after every step, and, where the
// distance jumps in one step, what differed in that step's forward (see
// support/world_size_drift.h). Printed; docs/data.md states the promise.
#include <cstdio>
#include <filesystem>
#include <map>

#include <gtest/gtest.h>

#include "integration/jobs.h"
#include "support/world_size_drift.h"
#include "support/shell.h"

namespace lockstep::testing {
namespace {

void print(const std::vector<WorldSizeDrift>& drifts) {
  std::printf("step");
  for (const auto& d : drifts) std::printf("  %s %d ranks", d.model.c_str(), d.world_size);
  std::printf("   (relative parameter distance to 1 rank)\n");
  for (size_t s = 0; s < drifts.front().distance.size(); ++s) {
    std::printf("%4zu", s + 1);
    for (const auto& d : drifts) std::printf("  %12.2e", d.distance[s]);
    std::printf("\n");
  }
  for (const auto& d : drifts)
    for (const auto& jump : d.jumps)
      std::printf("%s, %d ranks, step %lld: the distance grew %.1fx; in that step's forward with both runs' "
                  "parameters: %s\n", d.model.c_str(), d.world_size, static_cast<long long>(jump.step),
                  jump.growth, jump.forward.summary.c_str());
}

// Before any jump the runs differ by summation order only (well under 5e-7);
// every jump of more than 3x in one step is explained by a ReLU input or a
// max-pool window that the tiny difference tipped the other way.
void check(const std::vector<WorldSizeDrift>& drifts) {
  for (const auto& d : drifts) {
    ASSERT_EQ(d.distance.size(), 50u) << d.model << " " << d.world_size;
    EXPECT_LT(d.distance.front(), 1e-7) << d.model << " " << d.world_size << " ranks: step 1 already differs";
    const int64_t first_jump = d.jumps.empty() ? 51 : d.jumps.front().step;
    for (int64_t s = 1; s < first_jump; ++s)
      EXPECT_LT(d.distance[size_t(s - 1)], 5e-7) << d.model << " " << d.world_size << " ranks, step " << s;
    for (const auto& jump : d.jumps)
      EXPECT_GT(jump.forward.relu_flips + jump.forward.pool_changes, 0)
          << d.model << " " << d.world_size << " ranks: the jump at step " << jump.step
          << " is not explained by a ReLU or max-pool decision";
  }
}

TEST(WorldSizes, CnnDistanceToOneRankAfterEveryStepAndWhatDiffersWhereItJumps) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir dir;
  const auto drifts = measure_world_sizes("cnn", {2, 4}, 50, 64, dir.path());
  print(drifts);
  check(drifts);
}

TEST(WorldSizes, MlpDistanceToOneRankAfterEveryStepAndWhatDiffersWhereItJumps) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir dir;
  const auto drifts = measure_world_sizes("mlp", {2, 4}, 50, 64, dir.path());
  print(drifts);
  check(drifts);
}

// The job fixes the work (data.global_batch in microbatches of
// data.microbatch); comm.summation = exact (the default) sums it in
// integers, comm.buffers = mean (its default) keeps BatchNorm's statistics
// independent of who computed what, and every microbatch draws its own
// stream. The final parameter digest of 60 steps is the same on 1, 2 and 4
// ranks (one thread per rank): the built-in mlp and cnn (dropout), and a
// TorchScript CNN with BatchNorm and dropout on an image folder with
// augmentation, each in fp32 and bf16.
std::string final_digest_of(const std::string& runs) {
  return read_json(single_run(runs) + "/manifest.json")["metrics"]["final_param_digest"].get<std::string>();
}

std::string trained_digest(int ranks, std::vector<std::string> sets, std::string* output = nullptr) {
  TempDir dir;
  sets.push_back("job.world_size=" + std::to_string(ranks));
  sets.push_back("job.threads_per_rank=1");
  auto result = run_lockstep(synthetic_run(dir, ranks, sets), dir.path(), 150);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  if (output) *output = result.output;
  return result.exit_code == 0 ? final_digest_of(dir.path() + "/runs") : "failed";
}

const std::vector<std::string> kFixedWork = {"data.global_batch=64", "data.microbatch=16", "job.steps=60",
                                             "eval.every=20", "audit.every=20"};

// `decided`: a decision the 1-rank run must print.
void expect_the_same_bits(const std::string& model, const std::vector<std::string>& sets,
                          const std::string& decided = "Decision: comm.summation = exact") {
  for (const std::string precision : {"fp32", "bf16"}) {
    std::vector<std::string> all = kFixedWork;
    all.insert(all.end(), sets.begin(), sets.end());
    all.push_back("precision=" + precision);
    std::string output;
    const std::string one = trained_digest(1, all, &output);
    EXPECT_NE(output.find(decided), std::string::npos) << output;
    const std::string two = trained_digest(2, all), four = trained_digest(4, all);
    std::printf("%s, %s: 1 rank %s, 2 ranks %s, 4 ranks %s\n", model.c_str(), precision.c_str(), one.c_str(),
                two.c_str(), four.c_str());
    EXPECT_EQ(two, one) << model << " " << precision << " on 2 ranks";
    EXPECT_EQ(four, one) << model << " " << precision << " on 4 ranks";
  }
}

TEST(WorldSizes, TheMlpEndsOnTheSameBitsOnOneTwoAndFourRanks) {
  expect_the_same_bits("mlp", {"model.name=mlp"});
}

TEST(WorldSizes, TheCnnWithDropoutEndsOnTheSameBitsOnOneTwoAndFourRanks) {
  expect_the_same_bits("cnn", {"model.name=cnn", "model.dropout=0.3"});
  // The control: under comm.summation = float the same job parts (the
  // comparison would see a difference if there were one to see).
  std::vector<std::string> control = kFixedWork;
  control.insert(control.end(), {"model.name=cnn", "comm.summation=float"});
  EXPECT_NE(trained_digest(1, control), trained_digest(4, control)) << "float summation on 1 and 4 ranks";
}

// The scripted CNN with BatchNorm and dropout on an augmented image folder
// (made in `fixtures`); empty when Fashion-MNIST is not installed.
std::vector<std::string> scripted_image_job(const TempDir& fixtures) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist")) return {};
  const std::string fx = fixtures.path() + "/fx", images = fixtures.path() + "/img";
  auto made = python_tool("scripted_fixtures.py", "make " + fx + " 2>&1");
  EXPECT_EQ(made.exit_code, 0) << made.output;
  auto folder = python_tool("image_fixtures.py", "good " + images + " 40 10 2>&1");
  EXPECT_EQ(folder.exit_code, 0) << folder.output;
  return {"model.name=torchscript", "model.path=" + fx + "/bn_dropout28.pt", "data.name=images",
          "data.train=" + images + "/train", "data.test=" + images + "/test", "data.mean=0.286",
          "data.std=0.353", "data.augment=random_crop:4,hflip"};
}

TEST(WorldSizes, AScriptedCnnWithBatchNormAndDropoutOnAugmentedImagesEndsOnTheSameBits) {
  TempDir fixtures;
  const std::vector<std::string> sets = scripted_image_job(fixtures);
  if (sets.empty()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  expect_the_same_bits("scripted cnn (BatchNorm, dropout) on augmented images", sets,
                       "Decision: buffers = mean of the microbatches' changes");
}

// The scripted model's dropout draws from LibTorch's generator inside the
// module: a rank killed at step 23 and the job restarted from the
// checkpoint of step 20 ends on the digest of the run that was not killed.
TEST(WorldSizes, AScriptedModelWithDropoutKilledAndRestartedEndsOnTheUninterruptedBits) {
  TempDir fixtures;
  std::vector<std::string> sets = scripted_image_job(fixtures);
  if (sets.empty()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  sets.insert(sets.end(), {"data.global_batch=32", "data.microbatch=16", "job.steps=30", "checkpoint.every=10",
                           "eval.every=0", "job.threads_per_rank=1"});
  TempDir whole, killed;
  auto straight = run_lockstep(synthetic_run(whole, 2, sets), whole.path(), 150);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  sets.insert(sets.end(), {"fault.max_restarts=1", "test.fail_rank=1", "test.fail_step=23", "test.fail_kind=kill"});
  auto restarted = run_lockstep(synthetic_run(killed, 2, sets), killed.path(), 170);
  ASSERT_EQ(restarted.exit_code, 0) << restarted.output;
  EXPECT_NE(restarted.output.find("was killed by signal 9"), std::string::npos) << restarted.output;
  const auto manifest = read_json(single_run(killed.path() + "/runs") + "/manifest.json");
  ASSERT_EQ(manifest["restart_count"], 1) << manifest.dump(2);
  EXPECT_EQ(manifest["restarts"][0]["resumed_from_step"], 20);
  EXPECT_EQ(final_digest_of(killed.path() + "/runs"), final_digest_of(whole.path() + "/runs"))
      << "the restarted run's parameters and buffers differ from the uninterrupted run's";
}

// An elastic job on the scripted BatchNorm model: rank 3 of 4 is killed at
// step 23, mid-step for the others (their forwards have moved BatchNorm's
// statistics); the survivors keep the state after step 23, buffers put back,
// the replacement gets it from a live peer, and the run ends on the
// uninterrupted run's bits without reading a checkpoint.
TEST(WorldSizes, AnElasticJobKilledMidStepContinuesFromMemoryOnTheUninterruptedBits) {
  TempDir fixtures;
  std::vector<std::string> sets = scripted_image_job(fixtures);
  if (sets.empty()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  sets.insert(sets.end(), {"data.global_batch=64", "data.microbatch=16", "job.steps=30", "eval.every=0",
                           "audit.every=10", "job.threads_per_rank=1", "job.world_size=4"});
  TempDir whole, killed;
  auto straight = run_lockstep(synthetic_run(whole, 4, sets), whole.path(), 150);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  sets.insert(sets.end(), {"elastic.min_ranks=2", "test.fail_rank=3", "test.fail_step=23", "test.fail_kind=kill"});
  auto elastic = run_lockstep(synthetic_run(killed, 4, sets), killed.path(), 170);
  ASSERT_EQ(elastic.exit_code, 0) << elastic.output;
  EXPECT_NE(elastic.output.find("Decision: resume_from = memory, step 23"), std::string::npos) << elastic.output;
  const auto manifest = read_json(single_run(killed.path() + "/runs") + "/manifest.json");
  ASSERT_EQ(manifest["coordinator"]["membership"].size(), 1u) << manifest.dump(2);
  EXPECT_EQ(manifest["coordinator"]["membership"][0]["resumed_from_step"], 23);
  EXPECT_EQ(final_digest_of(killed.path() + "/runs"), final_digest_of(whole.path() + "/runs"))
      << "the elastic run's parameters and buffers differ from the uninterrupted run's";
}

// A checkpoint written by 4 ranks resumes on 2, and one written by 1 on 4;
// both end on the digest of the 4-rank run that never stopped, and
// `lockstep compare` says so. Against a run that summed in float it names
// the step where they parted.
TEST(WorldSizes, ACheckpointResumesOnAnotherWorldSizeAndEndsOnTheUninterruptedBits) {
  const std::vector<std::string> job = {"model.name=cnn", "model.dropout=0.3", "data.global_batch=64",
                                        "data.microbatch=16", "job.threads_per_rank=1", "checkpoint.every=10",
                                        "audit.every=5", "eval.every=0"};
  auto run = [&](const TempDir& dir, int ranks, std::vector<std::string> sets) {
    sets.insert(sets.begin(), job.begin(), job.end());
    auto result = run_lockstep(synthetic_run(dir, ranks, sets), dir.path(), 150);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return single_run(dir.path() + "/runs");
  };
  TempDir straight_dir, float_dir;
  const std::string straight = run(straight_dir, 4, {"job.world_size=4", "job.steps=40"});
  const std::string in_float = run(float_dir, 4, {"job.world_size=4", "job.steps=40", "comm.summation=float"});
  const std::string expected = final_digest_of(straight_dir.path() + "/runs");
  for (const auto& [first, then] : std::vector<std::pair<int, int>>{{4, 2}, {1, 4}}) {
    TempDir dir;
    const std::string folder = run(dir, first, {"job.world_size=" + std::to_string(first), "job.steps=20"});
    auto resumed = run_lockstep({"run", examples_dir() + "/synthetic.toml", "--nproc", std::to_string(then),
                                 "--resume", folder, "--set", "job.steps=40"},
                                dir.path(), 150);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("Decision: resume_world_size = " + std::to_string(first) + " -> " +
                                  std::to_string(then)), std::string::npos) << resumed.output;
    EXPECT_EQ(final_digest_of(dir.path() + "/runs"), expected) << first << " ranks, then " << then;
    if (then == 2) {  // what a resumed run must keep: the work of a step
      auto changed = run_lockstep({"run", examples_dir() + "/synthetic.toml", "--resume", folder, "--set",
                                   "job.steps=50", "--set", "data.global_batch=64", "--set", "data.microbatch=8"},
                                  dir.path(), 60);
      EXPECT_EQ(changed.exit_code, 2) << changed.output;
      EXPECT_NE(changed.output.find("data.microbatch was 16 in the checkpointed run and is 8 now"),
                std::string::npos) << changed.output;
    }
    auto compared = run_lockstep({"compare", straight, folder}, dir.path(), 30);
    EXPECT_EQ(compared.exit_code, 0) << compared.output;
    EXPECT_NE(compared.output.find("bit-identical"), std::string::npos) << compared.output;
  }
  auto parted = run_lockstep({"compare", straight, in_float, "--json"}, float_dir.path(), 30);
  EXPECT_EQ(parted.exit_code, 1) << parted.output;
  const auto verdict = nlohmann::json::parse(parted.output.substr(parted.output.find('{')));
  EXPECT_EQ(verdict["verdict"], "different");
  ASSERT_TRUE(verdict.contains("first_parted")) << parted.output;
  const int64_t parted_at = verdict["first_parted"]["step"].get<int64_t>();
  EXPECT_TRUE(parted_at == 1 || parted_at % 5 == 0) << parted.output;  // an audited step (the first, then every 5)
  EXPECT_GT(verdict["first_parted"]["largest_sum_difference"]["difference"].get<double>(), 0) << parted.output;
  // Unreadable evidence is exit 2 naming the file.
  auto missing = run_lockstep({"compare", straight, float_dir.path() + "/nowhere"}, float_dir.path(), 30);
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("/nowhere/manifest.json"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace lockstep::testing

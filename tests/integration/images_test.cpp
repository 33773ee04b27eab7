// data.name = "images": a folder of PNG and JPEG files by class, made from
// Fashion-MNIST by PIL (tests/python/image_fixtures.py), trained by real
// lockstep processes on 2 ranks; augmentation on each rank's stream; bad
// files named before anything starts, or skipped and counted in the
// manifest and in `lockstep status`.
#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include "integration/cluster.h"
#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

namespace fs = std::filesystem;

const std::string kImages = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/python/image_fixtures.py";

int python(const std::string& args) {
  return std::system(("timeout -s KILL 120 " LOCKSTEP_PYTHON " " + kImages + " " + args).c_str());
}

std::vector<std::string> image_sets(const std::string& root, std::vector<std::string> more) {
  std::vector<std::string> all = {"data.name=images", "data.train=" + root + "/train", "data.test=" + root + "/test",
                                  "model.name=mlp", "data.mean=0.286", "data.std=0.353", "data.batch_size=32"};
  all.insert(all.end(), more.begin(), more.end());
  return all;
}

std::vector<std::string> images_run(const std::string& runs, const std::string& root, std::vector<std::string> more) {
  std::vector<std::string> args = {"run", examples_dir() + "/synthetic.toml", "--nproc", "2", "--set",
                                   "job.run_dir=" + runs};
  for (auto& s : image_sets(root, std::move(more))) {
    args.push_back("--set");
    args.push_back(s);
  }
  return args;
}

#define REQUIRE_FMNIST() \
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) GTEST_SKIP() << "dataset-fashion-mnist is not installed"

TEST(Images, AFolderOfPngAndJpegByClassTrainsOnTwoRanksAndIsRecorded) {
  REQUIRE_FMNIST();
  TempDir dir;
  ASSERT_EQ(python("good " + dir.path() + "/img 500 100"), 0);
  const std::string runs = dir.path() + "/runs";
  auto result = run_lockstep(images_run(runs, dir.path() + "/img", {"job.steps=150"}), dir.path(), 150,
                             {"LOCKSTEP_CACHE_DIR=" + dir.path() + "/cache"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const char* needle : {"Decision: classes = 10 (0 Ankle_boot, 1 Bag, 2 Coat", "Decision: data.workers = ",
                             "Decision: data.scale = 1/255", "Decision: data.channels = 1",
                             "Decision: data.image_size = 28,28", "Decision: ignored_files = 1",
                             "Decision: resize = "})
    EXPECT_NE(result.output.find(needle), std::string::npos) << needle << "\n" << result.output;
  auto manifest = read_json(single_run(runs) + "/manifest.json");
  const double accuracy = manifest["metrics"]["test_accuracy"];
  std::printf("image folder (5,000 PNG and JPEG): test accuracy %.4f after 150 steps on 2 ranks\n", accuracy);
  EXPECT_GT(accuracy, 0.7);
  EXPECT_EQ(manifest["data_classes"].size(), 10u);
  EXPECT_EQ(manifest["data_classes"][9], "Trouser");
  const auto& files = manifest["data_files"];
  ASSERT_EQ(files.size(), 2u) << files.dump();
  EXPECT_EQ(files[0]["files"], 5000);
  EXPECT_EQ(files[1]["files"], 1000);
  EXPECT_EQ(files[0]["xxh3"].get<std::string>().size(), 16u);
  EXPECT_FALSE(files[0]["digest_cached"].get<bool>());
  EXPECT_EQ(manifest["bad_files"]["skipped_before_training"], 0);
  EXPECT_EQ(manifest["bad_files"]["skipped_in_batches"], 0);
  EXPECT_EQ(manifest["metrics"]["test_samples"], 1000);
}

// Crops and flips come from each rank's own stream: different on the two
// ranks, the same in a rerun with the same seed (and so the same model).
TEST(Images, AugmentationDiffersAcrossRanksAndRepeatsInARerun) {
  REQUIRE_FMNIST();
  TempDir dir;
  ASSERT_EQ(python("good " + dir.path() + "/img 100 20"), 0);
  auto run = [&](const std::string& name) {
    const std::string runs = dir.path() + "/" + name;
    auto result = run_lockstep(images_run(runs, dir.path() + "/img",
                                          {"job.steps=20", "data.augment=random_crop:4,hflip"}),
                               dir.path(), 120);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    std::vector<std::string> draws;
    for (int rank : {0, 1})
      for (const auto& e : read_json_lines(single_run(runs) + "/events-rank" + std::to_string(rank) + ".jsonl"))
        if (e["event"] == "augment") draws.push_back(e["draws_hash"]);
    return std::make_pair(read_json(single_run(runs) + "/manifest.json")["metrics"]["final_param_digest"], draws);
  };
  auto [first_digest, first] = run("first");
  auto [again_digest, again] = run("again");
  ASSERT_EQ(first.size(), 2u);
  EXPECT_NE(first[0], first[1]) << "both ranks drew the same crops and flips";
  EXPECT_EQ(first, again) << "a rerun with the same seed drew differently";
  EXPECT_EQ(first_digest, again_digest);
}

TEST(Images, ACutOrForeignFileIsNamedBeforeAnythingStartsOrSkippedAndCounted) {
  REQUIRE_FMNIST();
  TempDir dir;
  ASSERT_EQ(python("good " + dir.path() + "/img 50 10"), 0);
  ASSERT_EQ(python("corrupt " + dir.path() + "/img"), 0);
  const std::string refused = dir.path() + "/refused";
  auto error = run_lockstep(images_run(refused, dir.path() + "/img", {"job.steps=5"}), dir.path(), 60);
  EXPECT_EQ(error.exit_code, 2) << error.output;
  EXPECT_NE(error.output.find("Bag/cut.png: PNG without its IEND chunk"), std::string::npos) << error.output;
  EXPECT_NE(error.output.find("set data.bad_files = skip"), std::string::npos) << error.output;
  EXPECT_FALSE(fs::exists(refused)) << "a run folder was created for bad input";

  const std::string runs = dir.path() + "/runs";
  auto skipped = run_lockstep(images_run(runs, dir.path() + "/img", {"job.steps=5", "data.bad_files=skip"}),
                              dir.path(), 60);
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("2 file(s) skipped (data.bad_files = skip)"), std::string::npos) << skipped.output;
  auto bad = read_json(single_run(runs) + "/manifest.json")["bad_files"];
  EXPECT_EQ(bad["skipped_before_training"], 2) << bad.dump();
  ASSERT_EQ(bad["files"].size(), 2u);
  EXPECT_NE(bad["files"][1].get<std::string>().find("Coat/not-an-image.jpg: neither PNG nor JPEG"),
            std::string::npos) << bad.dump();
}

// A PNG whose header and end are whole but whose pixels are not passes the
// first check; decoding it fails. Default: the run stops naming it. Skip:
// its target counts as missing, and the count reaches the manifest and
// `lockstep status`.
TEST(Images, AFileThatFailsOnlyWhenDecodedStopsTheRunOrIsCountedInStatus) {
  REQUIRE_FMNIST();
  TempDir dir;
  ASSERT_EQ(python("good " + dir.path() + "/img 50 10"), 0);
  ASSERT_EQ(python("damaged " + dir.path() + "/img"), 0);
  // 501 training images, 16 a step on 2 ranks: step 32 has seen all of them.
  auto stopped = run_lockstep(images_run(dir.path() + "/stopped", dir.path() + "/img",
                                         {"job.steps=40", "data.batch_size=8"}), dir.path(), 120);
  EXPECT_EQ(stopped.exit_code, 2) << stopped.output;
  EXPECT_NE(stopped.output.find("Bag/damaged.png: does not decode (PNG: "), std::string::npos) << stopped.output;

  Cluster cluster(dir, image_sets(dir.path() + "/img", {"job.steps=3000", "data.batch_size=8",
                                                        "data.bad_files=skip", "fault.heartbeat_s=0.1"}));
  cluster.add_worker();
  cluster.add_worker();
  // Once the first epoch is through, status counts damaged.png (once per epoch since).
  std::string table;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (std::chrono::steady_clock::now() < deadline && table.find("bad files skipped: ") == std::string::npos)
    table = run_lockstep({"status", "--coordinator", cluster.address()}, dir.path(), 15,
                         {"LOCKSTEP_TOKEN=" + kToken}).output;
  const size_t at = table.find("bad files skipped: ");
  ASSERT_NE(at, std::string::npos) << table;
  EXPECT_GE(std::stoll(table.substr(at + 19)), 1) << table;
  for (auto& worker : cluster.workers) EXPECT_EQ(worker->wait(150), 0) << worker->output();
  EXPECT_EQ(cluster.coordinator->wait(30), 0) << cluster.coordinator->output();
  auto bad = read_json(single_run(dir.path() + "/runs") + "/manifest.json")["bad_files"];
  EXPECT_EQ(bad["skipped_before_training"], 0) << bad.dump();
  // 3,000 steps of 16 over 501 images: about 96 epochs, damaged.png met once in each.
  EXPECT_GE(bad["skipped_in_batches"].get<int64_t>(), 90) << bad.dump();
}

}  // namespace
}  // namespace lockstep::testing

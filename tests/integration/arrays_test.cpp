// data.name = "arrays": numpy's own files (tests/python/array_fixtures.py)
// trained by real lockstep processes on 2 ranks; a 2 GiB array read by rows;
// damaged files refused; provenance recorded and its digests cached.
#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

namespace fs = std::filesystem;

const std::string kArrays = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/python/array_fixtures.py";

int python(const std::string& args) {
  const std::string line = "timeout -s KILL 120 " LOCKSTEP_PYTHON " " + kArrays + " " + args;
  return std::system(line.c_str());
}

std::vector<std::string> arrays_run(const std::string& runs, const std::string& train,
                                    const std::string& test, std::vector<std::string> sets) {
  std::vector<std::string> all = {"data.name=arrays", "data.train=" + train, "data.test=" + test,
                                  "job.run_dir=" + runs, "data.batch_size=32"};
  all.insert(all.end(), sets.begin(), sets.end());
  std::vector<std::string> args = {"run", examples_dir() + "/synthetic.toml", "--nproc", "2"};
  for (auto& s : all) {
    args.push_back("--set");
    args.push_back(s);
  }
  return args;
}

const std::vector<std::string> kImageSets = {"model.name=mlp", "data.scale=0.00392156862745098",
                                             "data.mean=0.286", "data.std=0.353", "job.steps=150"};

TEST(Arrays, NpzOfUint8ImagesTrainsOnTwoRanksAndItsProvenanceIsRecordedAndCached) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir dir;
  ASSERT_EQ(python("good " + dir.path() + "/a"), 0);
  const std::vector<std::string> cache = {"LOCKSTEP_CACHE_DIR=" + dir.path() + "/cache"};
  std::vector<std::string> cached;
  for (const std::string name : {"fmnist", "fmnist-deflated", "fmnist"}) {
    const std::string runs = dir.path() + "/runs-" + std::to_string(cached.size());
    auto result = run_lockstep(arrays_run(runs, dir.path() + "/a/" + name + ".npz",
                                          dir.path() + "/a/fmnist-test.npz", kImageSets),
                               dir.path(), 120, cache);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    auto manifest = read_json(single_run(runs) + "/manifest.json");
    const double accuracy = manifest["metrics"]["test_accuracy"];
    std::printf("%s.npz: test accuracy %.4f after 150 steps\n", name.c_str(), accuracy);
    EXPECT_GT(accuracy, 0.7) << name;
    EXPECT_EQ(result.output.find("Decision: data_in_memory") != std::string::npos, name == "fmnist-deflated")
        << result.output;
    const auto& files = manifest["data_files"];
    ASSERT_EQ(files.size(), 2u) << files.dump();
    EXPECT_EQ(files[0]["bytes"], int64_t(fs::file_size(dir.path() + "/a/" + name + ".npz")));
    EXPECT_EQ(files[0]["xxh3"].get<std::string>().size(), 16u) << files.dump();
    cached.push_back(files[0]["digest_cached"].get<bool>() ? "cached" : "hashed");
  }
  EXPECT_EQ(cached, (std::vector<std::string>{"hashed", "hashed", "cached"}))
      << "the second run of fmnist.npz should take its digest from the cache";
}

TEST(Arrays, AFolderOfNpyWithNanTargetsTrainsARegression) {
  TempDir dir;
  ASSERT_EQ(python("good " + dir.path() + "/a"), 0);
  auto made = std::system(("timeout -s KILL 120 " LOCKSTEP_PYTHON " " + std::string(LOCKSTEP_SOURCE_DIR) +
                           "/tests/python/scripted_fixtures.py make " + dir.path() + "/fx").c_str());
  ASSERT_EQ(made, 0);
  const std::string runs = dir.path() + "/runs";
  auto result = run_lockstep(arrays_run(runs, dir.path() + "/a/regress/train", dir.path() + "/a/regress/test",
                                        {"model.name=torchscript", "model.path=" + dir.path() + "/fx/tied.pt",
                                         "loss.name=mse", "optim.lr=0.02", "job.steps=200",
                                         "eval.every=10"}),
                             dir.path(), 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::vector<double> mse;
  for (const auto& e : read_json_lines(single_run(runs) + "/events-rank0.jsonl"))
    if (e["event"] == "eval") mse.push_back(e["metrics"]["mse"]);
  ASSERT_GE(mse.size(), 2u);
  std::printf("test MSE after 10 steps %.4f, after 200 %.4f\n", mse.front(), mse.back());
  EXPECT_LT(mse.back(), 0.5 * mse.front());
  auto metrics = read_json(single_run(runs) + "/manifest.json")["metrics"];
  EXPECT_GT(metrics["masked_targets"].get<int64_t>(), 0) << "a quarter of the targets are NaN";
}

TEST(Arrays, ATwoGibibyteNpyKeepsEachRanksResidentSetSmall) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir dir;
  ASSERT_EQ(python("good " + dir.path() + "/a"), 0);
  ASSERT_EQ(python("big " + dir.path() + "/a 2740000"), 0);  // 2.0 GiB of uint8 images
  auto sets = kImageSets;
  sets.back() = "job.steps=300";
  // Each rank's peak resident set, in MiB, training on `train`.
  auto peaks = [&](const std::string& name, const std::string& train) {
    const std::string runs = dir.path() + "/runs-" + name;
    auto result = run_lockstep(arrays_run(runs, train, dir.path() + "/a/fmnist-test.npz", sets), dir.path(), 150);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    std::vector<double> rss;
    for (int rank : {0, 1})
      for (const auto& e : read_json_lines(single_run(runs) + "/events-rank" + std::to_string(rank) + ".jsonl"))
        if (e["event"] == "end") rss.push_back(e["peak_rss_mb"]);
    return rss;
  };
  // The same job on 6,000 Fashion-MNIST images (4.7 MB) is the baseline: what
  // LibTorch and its libraries hold (a CUDA LibTorch maps far more than a
  // CPU one); the 2 GiB file may add the batches in flight, not itself.
  const auto small = peaks("small", dir.path() + "/a/fmnist.npz");
  const auto big = peaks("big", dir.path() + "/a/big");
  ASSERT_EQ(small.size(), 2u);
  ASSERT_EQ(big.size(), 2u);
  for (int rank : {0, 1}) {
    std::printf("rank %d: peak RSS %.0f MiB with a %.2f GiB x.npy, %.0f MiB with 6,000 images\n", rank,
                big[size_t(rank)], double(fs::file_size(dir.path() + "/a/big/x.npy")) / (1 << 30),
                small[size_t(rank)]);
    EXPECT_LT(big[size_t(rank)] - small[size_t(rank)], 150.0) << "rank " << rank;
  }
}

// 1,001 test samples: no world size from 2 to 4 divides them. Each sample
// is evaluated exactly once (no padding by repetition), so the figures are
// the same whatever the world size; the global batch (24) is the same too.
TEST(Arrays, EvaluationCountsEveryTestSampleOnceWhateverTheWorldSize) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir dir;
  ASSERT_EQ(python("good " + dir.path() + "/a"), 0);
  std::vector<double> accuracy, loss;
  for (int world : {1, 2, 3, 4}) {
    const std::string runs = dir.path() + "/runs-" + std::to_string(world);
    auto args = arrays_run(runs, dir.path() + "/a/fmnist.npz", dir.path() + "/a/fmnist-1001.npz",
                           {"model.name=mlp", "data.scale=0.00392156862745098", "job.steps=3",
                            "data.batch_size=" + std::to_string(24 / world)});
    args[3] = std::to_string(world);  // --nproc
    auto result = run_lockstep(args, dir.path(), 120);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    auto metrics = read_json(single_run(runs) + "/manifest.json")["metrics"];
    EXPECT_EQ(metrics["test_samples"], 1001) << world << " ranks";
    EXPECT_EQ(metrics["test_metrics"]["targets"], 1001) << world << " ranks";
    accuracy.push_back(metrics["test_accuracy"]);
    loss.push_back(metrics["test_loss"]);
    std::printf("%d ranks: test accuracy %.6f, loss %.6f over 1001 samples\n", world, accuracy.back(),
                loss.back());
  }
  for (size_t i = 1; i < accuracy.size(); ++i) {
    EXPECT_EQ(accuracy[i], accuracy[0]) << (i + 1) << " ranks";
    EXPECT_NEAR(loss[i], loss[0], 1e-5) << (i + 1) << " ranks";
  }
}

// data.validation: a seeded fraction of the training set, or a file of its
// own, evaluated every eval.every steps; the test set at the end.
TEST(Arrays, AValidationSetIsHeldOutAndEvaluatedDuringTrainingTheTestSetAtTheEnd) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir dir;
  ASSERT_EQ(python("good " + dir.path() + "/a"), 0);
  for (const std::string& validation : std::vector<std::string>{"0.1", dir.path() + "/a/fmnist-1001.npz"}) {
    const std::string runs = dir.path() + "/runs-" + std::to_string(validation.size());
    auto sets = kImageSets;
    sets.push_back("data.validation=" + validation);
    sets.push_back("eval.every=50");
    auto result = run_lockstep(arrays_run(runs, dir.path() + "/a/fmnist.npz", dir.path() + "/a/fmnist-test.npz",
                                          sets), dir.path(), 120);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("Decision: validation = " + validation), std::string::npos) << result.output;
    std::vector<std::string> splits;
    for (const auto& e : read_json_lines(single_run(runs) + "/events-rank0.jsonl"))
      if (e["event"] == "eval") splits.push_back(e.value("split", "?") + "@" + std::to_string(e["step"].get<int64_t>()));
    EXPECT_EQ(splits, (std::vector<std::string>{"validation@50", "validation@100", "test@150"})) << validation;
    auto manifest = read_json(single_run(runs) + "/manifest.json");
    const int64_t held = validation == "0.1" ? 600 : 1001;
    EXPECT_EQ(manifest["metrics"]["validation_samples"], held) << validation;
    EXPECT_EQ(manifest["metrics"]["test_samples"], 1000) << validation;
    EXPECT_GT(manifest["metrics"]["validation_metrics"]["accuracy"].get<double>(), 0.6) << validation;
    if (validation == "0.1")  // 5,400 left to train on
      EXPECT_NE(result.output.find("validation 600 held out of 6000"), std::string::npos) << result.output;
  }
}

// data.augment draws from each rank's own stream: the draws differ across
// ranks, repeat in a rerun, and a kill-and-resume ends where an
// uninterrupted run ends.
TEST(Arrays, AugmentationDiffersAcrossRanksRepeatsInARerunAndSurvivesAResume) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir dir;
  ASSERT_EQ(python("good " + dir.path() + "/a"), 0);
  auto run = [&](const std::string& name, int steps) {
    const std::string runs = dir.path() + "/" + name;
    auto sets = kImageSets;
    sets.back() = "job.steps=" + std::to_string(steps);
    sets.push_back("data.augment=random_crop:4,hflip");
    sets.push_back("checkpoint.every=10");
    auto result = run_lockstep(arrays_run(runs, dir.path() + "/a/fmnist.npz", dir.path() + "/a/fmnist-test.npz",
                                          sets), dir.path(), 120);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    std::vector<std::string> draws;
    for (int rank : {0, 1})
      for (const auto& e : read_json_lines(single_run(runs) + "/events-rank" + std::to_string(rank) + ".jsonl"))
        if (e["event"] == "augment") draws.push_back(e["draws_hash"]);
    return std::make_pair(single_run(runs), draws);
  };
  auto [first, first_draws] = run("first", 20);
  auto [again, again_draws] = run("again", 20);
  ASSERT_EQ(first_draws.size(), 2u);
  EXPECT_NE(first_draws[0], first_draws[1]) << "both ranks drew the same crops and flips";
  EXPECT_EQ(first_draws, again_draws) << "a rerun with the same seed drew differently";
  const std::string digest = read_json(first + "/manifest.json")["metrics"]["final_param_digest"];
  EXPECT_EQ(read_json(again + "/manifest.json")["metrics"]["final_param_digest"], digest);
  auto [cut, cut_draws] = run("cut", 10);
  auto resumed = run_lockstep({"run", examples_dir() + "/synthetic.toml", "--resume", cut, "--set", "job.steps=20"},
                              dir.path(), 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(read_json(cut + "/manifest.json")["metrics"]["final_param_digest"], digest)
      << "the resumed run's augmentation did not continue where the checkpoint left it";
  // Bad input: not images, an unknown step.
  for (const auto& [augment, needle] : std::vector<std::pair<std::string, std::string>>{
           {"hflip", "data.augment needs image inputs"}, {"rotate:10", "data.augment item 'rotate:10'"}}) {
    const std::string runs = dir.path() + "/bad";
    auto bad = run_lockstep(arrays_run(runs, dir.path() + "/a/regress/train", dir.path() + "/a/regress/test",
                                       {"data.augment=" + augment, "job.steps=1", "model.name=mlp"}),
                            dir.path(), 60);
    EXPECT_EQ(bad.exit_code, 2) << bad.output;
    EXPECT_NE(bad.output.find(needle), std::string::npos) << bad.output;
    EXPECT_FALSE(fs::exists(runs));
  }
}

TEST(Arrays, DamagedArraysAreRefusedNamingTheFileAndWhatWasFound) {
  TempDir dir;
  ASSERT_EQ(python("bad " + dir.path()), 0);
  ASSERT_EQ(python("good " + dir.path()), 0);
  const std::string test = dir.path() + "/regress/test";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"big_endian", "big_endian/x.npy: dtype '>f4' is big-endian"},
      {"fortran", "fortran/x.npy: the array is in Fortran order"},
      {"objects", "objects/y.npy: dtype '|O' is not supported"},
      {"mismatch", "has 16 rows but"},
      {"truncated", "truncated/x.npy: the header promises 50176 bytes"},
      {"wrong_keys.npz", "wrong_keys.npz has no array 'x' (it holds: images, labels)"}};
  for (const auto& [name, needle] : cases) {
    const std::string runs = dir.path() + "/runs-" + name;
    auto result = run_lockstep(arrays_run(runs, dir.path() + "/" + name, test, {"job.steps=1"}), dir.path(), 60);
    EXPECT_EQ(result.exit_code, 2) << name << "\n" << result.output;
    EXPECT_NE(result.output.find(needle), std::string::npos) << name << ": no '" << needle << "' in\n"
                                                              << result.output;
    EXPECT_FALSE(fs::exists(runs)) << name << ": a run folder was created";
  }
}

}  // namespace
}  // namespace lockstep::testing

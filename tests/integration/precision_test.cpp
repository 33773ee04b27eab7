// Device and precision on this CPU-only machine, end to end: refusals with
// their reasons (exit 2), auto's decisions with the probe figure behind
// them, bf16 training against fp32, the gradient scaler skipping exactly
// the steps with injected inf gradients on every rank, the overflow finder,
// and `lockstep probe` with its cache.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "integration/jobs.h"
#include "lockstep/build_config.h"
#include "runtime/precision/probe.h"

namespace lockstep::testing {
namespace {

void expect_refused(const std::vector<std::string>& sets, const std::string& reason) {
  TempDir dir;
  auto result = run_lockstep(synthetic_run(dir, 2, sets), dir.path(), 60);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(reason), std::string::npos) << result.output;
}

// These tests run where no GPU is visible: a CUDA build says that, a
// CPU-only build that it has no CUDA.
TEST(Precision, WhatThisMachineCannotGiveIsRefusedWithTheReason) {
  expect_refused({"device=gpu"}, LOCKSTEP_HAS_CUDA ? "device = gpu, but no CUDA device is visible"
                                                   : "built against a LibTorch without CUDA");
  expect_refused({"comm.backend=nccl"}, LOCKSTEP_HAS_CUDA ? "comm.backend = nccl reduces CUDA tensors only, and no "
                                                            "CUDA device is visible"
                                                          : "NCCL data group is not compiled into this lockstep");
  expect_refused({"precision=fp16"}, "fp16 runs only on CUDA");
  expect_refused({"device=cpu", "comm.backend=nccl"},
                 LOCKSTEP_HAS_CUDA ? "comm.backend = nccl reduces CUDA tensors only, and the job asks for device = cpu"
                                   : "NCCL data group is not compiled into this lockstep");
}

TEST(Precision, AutoDecidesDeviceAndPrecisionAndSaysWhy) {
  TempDir dir, cache;
  auto result = run_lockstep(synthetic_run(dir, 2, {"precision=auto", "device=auto", "job.steps=5"}),
                             dir.path(), 90, {"LOCKSTEP_CACHE_DIR=" + cache.path()});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find(LOCKSTEP_HAS_CUDA ? "Decision: device = cpu (device = auto and no CUDA device is visible)"
                                                 : "Decision: device = cpu (device = auto and this build's LibTorch "
                                                   "has no CUDA)"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("Decision: comm.backend = gloo (auto: this rank trains on the CPU, and Gloo "
                               "serves CPU tensors)"), std::string::npos) << result.output;
  const bool native = result.output.find("no native bf16") == std::string::npos;
  if (native) {  // the choice rests on the probe's figures, measured once for both ranks
    EXPECT_NE(result.output.find("the probe measured bf16 at"), std::string::npos) << result.output;
    EXPECT_TRUE(std::filesystem::exists(cache.path() + "/probe.json"));
    EXPECT_NE(result.output.find("measured now"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("cached in"), std::string::npos) << result.output;
  } else {
    EXPECT_NE(result.output.find("Decision: precision = fp32 (auto: this CPU has no native bf16"),
              std::string::npos) << result.output;
  }
}

TEST(Precision, AnUnwritableProbeCacheUsesTheFiguresAndSaysTheyWereNotCached) {
  TempDir dir;
  std::ofstream(dir.path() + "/a-file") << "not a folder\n";
  const std::string cache = dir.path() + "/a-file/cache";  // cannot be made
  auto result = run_lockstep({"probe", "--json"}, dir.path(), 120, {"LOCKSTEP_CACHE_DIR=" + cache});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("the figures are used but not cached"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("\"tflops\""), std::string::npos) << result.output;
}

double accuracy_of(const std::string& precision, double* step_s) {
  TempDir dir;
  auto result = run_lockstep({"run", examples_dir() + "/fashion_mnist_cnn.toml", "--nproc", "2",
                              "--set", "job.run_dir=" + dir.path() + "/runs", "--set",
                              "job.epochs=0", "--set", "job.steps=300", "--set", "eval.every=0",
                              "--set", "precision=" + precision, "--set",
                              "precision.allow_emulated=true"},
                             dir.path(), 240);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  *step_s = manifest["metrics"].value("step_s_median", 0.0);
  return manifest["metrics"]["test_accuracy"];
}

TEST(Precision, Bf16TrainsTheCnnWithinOnePointOfFp32) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  if (native_bf16_cpu_flags().empty())
    GTEST_SKIP() << "this CPU has no native bf16 (neither avx512_bf16 nor amx_bf16): emulated bf16 "
                    "trains the cnn several times slower than fp32, past this test's time limit; "
                    "the accuracy comparison runs where bf16 is native";
  double fp32_step = 0, bf16_step = 0;
  const double fp32 = accuracy_of("fp32", &fp32_step);
  const double bf16 = accuracy_of("bf16", &bf16_step);
  std::printf("cnn, 300 steps: test accuracy fp32 %.4f, bf16 %.4f; step time bf16/fp32 %.2f\n",
              fp32, bf16, fp32_step > 0 ? bf16_step / fp32_step : 0.0);
  EXPECT_NEAR(bf16, fp32, 0.01);
}

// inf in one gradient element on rank 1 at steps 3 and 9: after the
// all-reduce every rank sees it, so both skip exactly those steps; the
// scale follows the hand computation (1024, growth every 4 good steps).
TEST(Precision, ScalerSkipsExactlyTheInjectedStepsOnEveryRank) {
  TempDir dir;
  auto result = run_lockstep(
      synthetic_run(dir, 2, {"job.steps=12", "precision.scaler=on", "precision.init_scale=1024",
                             "precision.growth_interval=4",
                             "fault.inject=inf_grad:fc1.weight:1:3;inf_grad:fc1.weight:1:9"}),
      dir.path(), 90);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string run = single_run(dir.path() + "/runs");
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<int> skipped;
    for (const auto& event : read_json_lines(run + "/events-rank" + std::to_string(rank) + ".jsonl"))
      if (event.value("event", "") == "scaler_skipped_step") skipped.push_back(event["step"]);
    EXPECT_EQ(skipped, (std::vector<int>{3, 9})) << "rank " << rank;
  }
  auto manifest = read_json(run + "/manifest.json");
  const auto& scaler = manifest["metrics"]["scaler"];
  EXPECT_EQ(scaler["skipped"], 2) << scaler.dump();
  EXPECT_EQ(scaler["steps"], 12);
  EXPECT_EQ(scaler["skipped_steps"][0]["scale_after"], 512.0);
  EXPECT_EQ(scaler["skipped_steps"][1]["scale_after"], 512.0);
  EXPECT_EQ(scaler["final_scale"], 512.0);
  // The coordinator has the count too, from every rank's report.
  for (const auto& worker : manifest["coordinator"]["workers"])
    EXPECT_EQ(worker["scaler_skipped"], 2) << worker.dump();
  // 2 of 12 is more than precision.max_skipped_share (5%): said loudly.
  EXPECT_NE(result.output.find("Decision: grad_scaler_skipped = 2 of 12 steps"), std::string::npos)
      << result.output;
}

TEST(Precision, OverflowFinderNamesThePlantedModule) {
  TempDir dir;
  auto result = run_lockstep(synthetic_run(dir, 2, {"job.steps=10", "precision.check_overflow=true",
                                                    "fault.inject=perturb:fc2.bias:0:4:inf"}),
                             dir.path(), 90);
  EXPECT_EQ(result.exit_code, 1) << result.output;  // the loss is not finite any more
  EXPECT_NE(result.output.find("precision.check_overflow: rank 0 step 5 (input batch 4 of this "
                               "rank): the first module whose output holds inf or NaN is 'fc2'"),
            std::string::npos) << result.output;
}

TEST(Precision, ProbePrintsItsTableWritesTheCacheAndReRunsForAnotherMachine) {
  TempDir cache;
  const std::vector<std::string> env = {"LOCKSTEP_CACHE_DIR=" + cache.path()};
  auto first = run_lockstep({"probe"}, cache.path(), 120, env);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("cpu      fp32   matmul"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("cpu      bf16   conv"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find(LOCKSTEP_HAS_CUDA ? "GPU paths: compiled in" : "GPU paths: absent"), std::string::npos)
      << first.output;
  EXPECT_NE(first.output.find("measured now"), std::string::npos) << first.output;
  const std::string path = cache.path() + "/probe.json";
  ASSERT_TRUE(std::filesystem::exists(path));

  auto again = run_lockstep({"probe"}, cache.path(), 60, env);
  EXPECT_NE(again.output.find("source: cached in"), std::string::npos) << again.output;

  // The same cache on another machine: a different CPU in the fingerprint.
  auto stored = read_json(path);
  stored["fingerprint"]["cpu_model"] = "Some Other CPU";
  std::ofstream(path) << stored.dump();
  auto moved = run_lockstep({"probe"}, cache.path(), 120, env);
  ASSERT_EQ(moved.exit_code, 0) << moved.output;
  EXPECT_NE(moved.output.find("the fingerprint changed (cpu_model: \"Some Other CPU\" -> "),
            std::string::npos) << moved.output;
  EXPECT_NE(read_json(path)["fingerprint"]["cpu_model"], "Some Other CPU");
}

}  // namespace
}  // namespace lockstep::testing

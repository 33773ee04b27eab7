// The README's default job, end to end: the cnn on Fashion-MNIST with 2
// ranks must reach a test accuracy of at least 0.90.
#include <filesystem>

#include <gtest/gtest.h>

#include "support/cli_runner.h"

namespace lockstep::testing {
namespace {

TEST(DefaultJob, CnnOnFashionMnistReachesNinetyPercent) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir dir;
  auto result = run_lockstep({"run", examples_dir() + "/fashion_mnist_cnn.toml", "--nproc", "2",
                              "--set", "job.run_dir=" + dir.path() + "/runs"},
                             dir.path(), 840);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  double accuracy = manifest["metrics"]["test_accuracy"];
  std::printf("default job: test accuracy %.4f in %.1f s\n", accuracy, result.seconds);
  EXPECT_GE(accuracy, 0.90);
  EXPECT_EQ(manifest["metrics"]["test_samples"], 10000);
  // Its model-final.pt is a module PyTorch loads and scores to the same accuracy.
  const auto scored = python_tool("score_run.py", single_run(dir.path() + "/runs") + " 2>&1", 300);
  ASSERT_EQ(scored.exit_code, 0) << scored.output;
  const auto python = nlohmann::json::parse(scored.output.substr(scored.output.rfind('{')));
  EXPECT_NEAR(python["accuracy"].get<double>(), accuracy, 1e-6) << scored.output;
}

}  // namespace
}  // namespace lockstep::testing

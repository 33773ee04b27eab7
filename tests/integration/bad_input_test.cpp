// Bad input ends with exit code 2 and one line that names the problem,
// before any process group exists: no run folder is left behind.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

namespace fs = std::filesystem;

// Runs, expects exit 2, an error line containing `needle`, and no run folder.
void expect_bad_input(const TempDir& dir, const std::vector<std::string>& args,
                      const std::string& needle) {
  auto result = run_lockstep(args, dir.path(), 60);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  bool named = false;
  std::istringstream lines(result.output);
  for (std::string line; std::getline(lines, line);)
    named |= line.find("error") != std::string::npos && line.find(needle) != std::string::npos;
  EXPECT_TRUE(named) << "no error line naming '" << needle << "' in:\n" << result.output;
  EXPECT_FALSE(fs::exists(dir.path() + "/runs")) << "a run folder was created";
}

TEST(BadInput, UnknownKey) {
  TempDir dir;
  expect_bad_input(dir, synthetic_run(dir, 2, {"optim.lrr=0.1"}), "unknown key 'optim.lrr'");
}

TEST(BadInput, WrongType) {
  TempDir dir;
  expect_bad_input(dir, synthetic_run(dir, 2, {"optim.lr=fast"}),
                   "key 'optim.lr' must be a number");
}

TEST(BadInput, WorldSizeZero) {
  TempDir dir;
  std::ofstream(dir.path() + "/job.toml")
      << "[job]\nworld_size = 0\nsteps = 5\nrun_dir = \"" << dir.path() << "/runs\"\n"
      << "[data]\nname = \"synthetic\"\n";
  expect_bad_input(dir, {"run", dir.path() + "/job.toml"}, "key 'job.world_size' must be an integer in [1, 4096], got 0");
}

TEST(BadInput, MissingDatasetPath) {
  TempDir dir;
  expect_bad_input(dir, synthetic_run(dir, 2, {"data.name=fashion-mnist", "data.path=/no/such/folder"}),
                   "data.path = /no/such/folder: no such folder");
}

TEST(BadInput, TruncatedIdxFile) {
  const std::string real = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(real)) GTEST_SKIP() << real << " is not installed";
  TempDir dir;
  const std::string data = dir.path() + "/data";
  fs::create_directories(data);
  for (const char* name : {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                           "t10k-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz"})
    fs::copy_file(real + "/" + name, data + "/" + name);
  fs::resize_file(data + "/train-images-idx3-ubyte.gz", 100000);
  expect_bad_input(dir, synthetic_run(dir, 2, {"data.name=fashion-mnist", "data.path=" + data}),
                   "train-images-idx3-ubyte.gz: corrupt or truncated");
}

TEST(BadInput, UnknownModelAndImpossibleDevice) {
  TempDir dir;
  expect_bad_input(dir, synthetic_run(dir, 2, {"model.name=resnet"}),
                   "model.name = resnet is not registered (allowed: cnn, deep_mlp, mlp)");
  expect_bad_input(dir, synthetic_run(dir, 2, {"device=gpu"}), "device = gpu");
}

TEST(BadInput, WorkerWithoutTorchrunVariables) {
  TempDir dir;
  ::unsetenv("RANK");
  expect_bad_input(dir, {"worker", examples_dir() + "/synthetic.toml", "--set",
                         "job.run_dir=" + dir.path() + "/runs"},
                   "environment variable RANK is not set");
}

TEST(BadInput, UnknownFlag) {
  TempDir dir;
  auto result = run_lockstep({"run", examples_dir() + "/synthetic.toml", "--nprocs", "2"},
                             dir.path(), 30);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--nprocs"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace lockstep::testing

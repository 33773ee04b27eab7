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
  expect_bad_input(dir, {"run", dir.path() + "/job.toml"}, "key 'job.world_size' must be an integer in [1, 65536], got 0");
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
                   "model.name = resnet is not registered (allowed: cnn, deep_mlp, mlp, torchscript)");
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

// Settings that would make a run misbehave rather than fail: refused.
TEST(BadInput, HeartbeatTimeoutNotAboveThePeriod) {
  TempDir dir;
  expect_bad_input(dir, synthetic_run(dir, 2, {"fault.heartbeat_s=2", "fault.heartbeat_timeout_s=2"}),
                   "fault.heartbeat_timeout_s = 2 must be above fault.heartbeat_s = 2");
}

TEST(BadInput, PeriodsAndTimeoutsUnderAMillisecond) {
  TempDir dir;
  expect_bad_input(dir, synthetic_run(dir, 2, {"fault.heartbeat_s=0.0001"}),
                   "key 'fault.heartbeat_s' must be a number in [0.001, 3600]");
  expect_bad_input(dir, synthetic_run(dir, 2, {"comm.barrier_timeout_s=0.0004"}),
                   "key 'comm.barrier_timeout_s' must be a number in [0.001, 86400]");
}

TEST(BadInput, JobNameThatCannotNameAFolder) {
  TempDir dir;
  expect_bad_input(dir, synthetic_run(dir, 2, {"job.name=" + std::string(300, 'x')}),
                   "1 to 100 characters without '/' (now 300)");
  expect_bad_input(dir, synthetic_run(dir, 2, {"job.name=a/b"}), "job.name 'a/b'");
}

TEST(BadInput, InjectedFaultOnATensorTheModelLacks) {
  TempDir dir;
  expect_bad_input(dir, synthetic_run(dir, 2, {"fault.inject=perturb:nosuch.weight:1:3:1e-7"}),
                   "fault.inject names tensor 'nosuch.weight', which model mlp does not have");
}

TEST(BadInput, RankThatIsNotANumber) {
  TempDir dir;
  auto result = run_lockstep({"worker", "--coordinator", "127.0.0.1:1"}, dir.path(), 30,
                             {"RANK=1abc", "LOCKSTEP_TOKEN=bad-input-token-0123456789"});
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("environment variable RANK = '1abc' must be an integer"), std::string::npos)
      << result.output;
}

TEST(BadInput, ListenAddressesAndTlsFilesAreNamed) {
  TempDir dir;
  const std::string job = examples_dir() + "/synthetic.toml";
  const std::vector<std::string> token = {"LOCKSTEP_TOKEN=bad-input-token-0123456789"};
  auto expect = [&](std::vector<std::string> args, const std::string& needle) {
    auto result = run_lockstep(args, dir.path(), 30, token);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find(needle), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("listening on"), std::string::npos) << result.output;
  };
  expect({"coordinator", job, "--listen", "127.0.0.1:70000"}, "--listen '127.0.0.1:70000': port '70000' is not a number from 0 to 65535");
  expect({"coordinator", job, "--listen", "foo"}, "--listen 'foo': no port");
  expect({"coordinator", job, "--listen", "no-such-host.invalid:5"}, "host 'no-such-host.invalid' does not resolve");
  expect({"worker", "--coordinator", "127.0.0.1:99999"}, "--coordinator '127.0.0.1:99999': port");

  const std::string garbage = dir.path() + "/garbage.pem";
  std::ofstream(garbage) << "not a certificate\n";
  std::string made;
  for (const char* n : {"1", "2"})
    made += "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -keyout " + dir.path() +
            "/key" + n + ".pem -out " + dir.path() + "/cert" + n + ".pem >/dev/null 2>&1 && ";
  ASSERT_EQ(std::system((made + "true").c_str()), 0);
  const std::string cert1 = dir.path() + "/cert1.pem", key1 = dir.path() + "/key1.pem", key2 = dir.path() + "/key2.pem";
  expect({"coordinator", job, "--listen", "127.0.0.1:0", "--tls-cert", garbage, "--tls-key", key1},
         "--tls-cert " + garbage + ": not a PEM certificate");
  expect({"coordinator", job, "--listen", "127.0.0.1:0", "--tls-cert", cert1, "--tls-key", garbage},
         "--tls-key " + garbage + ": not a PEM private key");
  expect({"coordinator", job, "--listen", "127.0.0.1:0", "--tls-cert", cert1, "--tls-key", key2},
         "--tls-key " + key2 + " does not belong to the certificate in --tls-cert " + cert1);
  expect({"worker", "--coordinator", "127.0.0.1:1", "--tls-ca", garbage}, "--tls-ca " + garbage + ": not a PEM certificate");
  EXPECT_FALSE(fs::exists(dir.path() + "/runs"));
}

}  // namespace
}  // namespace lockstep::testing

namespace lockstep::testing {
namespace {

// The work a job fixes must divide: each refusal names the setting and
// what would work, before any process group.
TEST(BadInput, AWorldSizeThatDoesNotDivideTheMicrobatches) {
  TempDir dir;
  expect_bad_input(dir, synthetic_run(dir, 3, {"job.world_size=3", "data.global_batch=64", "data.microbatch=16"}),
                   "job.world_size = 3 does not divide the 4 microbatches of a step (data.global_batch = 64 / "
                   "data.microbatch = 16); world sizes that do: 1, 2, 4");
}

TEST(BadInput, AMicrobatchThatDoesNotDivideTheGlobalBatch) {
  TempDir dir;
  expect_bad_input(dir, synthetic_run(dir, 2, {"data.global_batch=64", "data.microbatch=24"}),
                   "data.global_batch = 64 is not a multiple of data.microbatch = 24");
}

TEST(BadInput, AGlobalBatchLargerThanTheData) {
  TempDir dir;
  expect_bad_input(dir, synthetic_run(dir, 2, {"data.synthetic_samples=256", "data.global_batch=4096",
                                               "data.microbatch=2048"}),
                   "data.global_batch = 4096 is more than the");
}

}  // namespace
}  // namespace lockstep::testing

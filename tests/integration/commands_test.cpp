// The small commands a person uses around a job: --version, config (the
// effective configuration, read back to the same), keys.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "integration/jobs.h"
#include "lockstep/build_config.h"
#include "runtime/config.h"

namespace lockstep::testing {
namespace {

TEST(Commands, VersionConfigThatReadsBackAndKeys) {
  TempDir dir;
  auto version = run_lockstep({"--version"}, dir.path(), 30);
  EXPECT_EQ(version.exit_code, 0) << version.output;
  EXPECT_NE(version.output.find("lockstep " LOCKSTEP_VERSION), std::string::npos) << version.output;

  const std::string job = examples_dir() + "/fashion_mnist_cnn.toml";
  auto printed = run_lockstep({"config", job, "--set", "optim.lr=0.125", "--set", "data.augment=hflip"}, dir.path(), 30);
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  EXPECT_NE(printed.output.find("\nlr = 0.125  # --set\n"), std::string::npos) << printed.output;
  EXPECT_NE(printed.output.find("\nname = \"cnn\"  # " + job + "\n"), std::string::npos) << printed.output;
  const std::string effective = dir.path() + "/effective.toml";
  std::ofstream(effective) << printed.output;
  // Read back, the printed file is the same job.
  auto original = run_lockstep({"config", job, "--set", "optim.lr=0.125", "--set", "data.augment=hflip", "--json"},
                               dir.path(), 30);
  auto again = run_lockstep({"config", effective, "--json"}, dir.path(), 30);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(nlohmann::json::parse(again.output)["config"], nlohmann::json::parse(original.output)["config"]);
  EXPECT_EQ(nlohmann::json::parse(original.output)["sources"]["optim.lr"], "--set");

  auto bad = run_lockstep({"config", job, "--set", "optim.lrr=1"}, dir.path(), 30);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("optim.lr"), std::string::npos) << "a did-you-mean: " << bad.output;

  auto keys = run_lockstep({"keys", "--json"}, dir.path(), 30);
  ASSERT_EQ(keys.exit_code, 0) << keys.output;
  const auto listed = nlohmann::json::parse(keys.output);
  EXPECT_EQ(listed.size(), known_keys().size());
  bool found = false;
  for (const auto& k : listed)
    if (k["key"] == "data.bad_files") {
      found = true;
      EXPECT_EQ(k["default"], "\"error\"");
      EXPECT_EQ(k["allowed"], "one of: error, skip");
    }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace lockstep::testing

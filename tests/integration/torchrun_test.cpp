// The torchrun way still works without any coordinator: two `lockstep
// worker JOB.toml` processes with RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT; rank 0 hosts the c10d TCPStore.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

TEST(Torchrun, TwoWorkersFromEnvironmentVariablesTrainToTheEnd) {
  TempDir dir;
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<LockstepProcess>> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.push_back(std::make_unique<LockstepProcess>(
        std::vector<std::string>{"worker", examples_dir() + "/synthetic.toml", "--set",
                                 "job.run_dir=" + dir.path() + "/runs", "--set", "job.steps=20"},
        dir.path(),
        std::vector<std::string>{"RANK=" + std::to_string(rank), "WORLD_SIZE=2",
                                 "LOCAL_RANK=" + std::to_string(rank), "MASTER_ADDR=127.0.0.1",
                                 "MASTER_PORT=" + port}));
  for (auto& r : ranks) EXPECT_EQ(r->wait(120), 0) << r->output();
  EXPECT_NE(ranks[0]->output().find("hosted by rank 0"), std::string::npos) << ranks[0]->output();
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "completed");
  EXPECT_EQ(manifest["metrics"]["steps"], 20);
  EXPECT_FALSE(manifest.contains("coordinator"));
}

TEST(Torchrun, WorldSizeDisagreementIsBadInput) {
  TempDir dir;
  auto result = run_lockstep({"worker", examples_dir() + "/synthetic.toml", "--set",
                              "job.run_dir=" + dir.path() + "/runs"},
                             dir.path(), 60,
                             {"RANK=0", "WORLD_SIZE=3", "MASTER_ADDR=127.0.0.1",
                              "MASTER_PORT=" + std::to_string(free_port())});
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("job.world_size = 2"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace lockstep::testing

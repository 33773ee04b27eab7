// Multi-host training on namespace hosts (support/net_hosts.h): a
// coordinator host and worker hosts with their own addresses, host names
// and run folders, on one machine. Each host's host name resolves
// differently (to its address, to 127.0.1.1, not at all), as on real lab
// machines. Every test compares the final parameters with `lockstep run`
// of the same job on this one host.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "integration/jobs.h"
#include "runtime/checkpoint/checkpoint_store.h"
#include "support/cli_runner.h"
#include "support/net_hosts.h"

namespace lockstep::testing {
namespace {

const std::string kToken = "multihost-token-0123456789abcdef";
constexpr int kPort = 29400;  // inside the namespace hosts every port is free

std::vector<std::string> with_sets(std::vector<std::string> args, const std::vector<std::string>& sets) {
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  return args;
}

// The final parameter digest that `lockstep run` reaches on this host.
std::string reference_digest(const TempDir& dir, int nproc, const std::vector<std::string>& sets) {
  auto result = run_lockstep(with_sets(synthetic_run(dir, nproc, {}), sets), dir.path(), 150);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  return manifest["metrics"].value("final_param_digest", "missing");
}

// The value of decision `what` in a rank's events file ("" if absent).
std::string decision(const std::string& events_file, const std::string& what) {
  for (const auto& e : read_json_lines(events_file))
    if (e.value("event", "") == "decision" && e.value("what", "") == what) return e.value("value", "");
  return "";
}

class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = NetHosts::unavailable(); !why.empty()) GTEST_SKIP() << why;
    hosts = std::make_unique<NetHosts>(dir.path());
  }

  // A folder of this host's own: hosts share no run folder unless told to.
  std::string home(const std::string& host) {
    const std::string path = dir.path() + "/" + host;
    std::filesystem::create_directories(path);
    return path;
  }

  std::string coordinator_address() const { return hosts->address(coordinator_host) + ":" + std::to_string(kPort); }

  LockstepProcess& start_coordinator(const std::string& host, const std::vector<std::string>& sets,
                                     const std::string& cwd = "") {
    coordinator_host = host;
    auto args = with_sets({"coordinator", examples_dir() + "/synthetic.toml", "--listen",
                           coordinator_address(), "--set", "job.run_dir=runs"},
                          sets);
    processes.push_back(std::make_unique<LockstepProcess>(
        args, cwd.empty() ? home(host) : cwd, std::vector<std::string>{"LOCKSTEP_TOKEN=" + kToken},
        hosts->on(host)));
    return *processes.back();
  }

  LockstepProcess& start_worker(const std::string& host, int local_rank,
                                std::vector<std::string> env = {}, const std::string& cwd = "") {
    env.push_back("LOCKSTEP_TOKEN=" + kToken);
    env.push_back("LOCAL_RANK=" + std::to_string(local_rank));
    processes.push_back(std::make_unique<LockstepProcess>(
        std::vector<std::string>{"worker", "--coordinator", coordinator_address(),
                                 "--rendezvous-timeout", "60"},
        cwd.empty() ? home(host) : cwd, env, hosts->on(host)));
    return *processes.back();
  }

  // A job on as many ranks as `workers` (host, local rank), its coordinator
  // on `coordinator_host`; waits for every process it started and returns
  // the run folder ("" after a failure, recorded).
  std::string run_across(const std::string& coordinator_host,
                         const std::vector<std::pair<std::string, int>>& workers, std::vector<std::string> sets) {
    sets.push_back("job.world_size=" + std::to_string(workers.size()));
    const size_t first = processes.size();
    auto& coordinator = start_coordinator(coordinator_host, sets);
    for (const auto& [host, local_rank] : workers) start_worker(host, local_rank);
    const int status = coordinator.wait(180);
    EXPECT_EQ(status, 0) << coordinator.output();
    for (size_t p = first; p < processes.size(); ++p) EXPECT_EQ(processes[p]->wait(30), 0) << processes[p]->output();
    return status == 0 ? single_run(home(coordinator_host) + "/runs") : "";
  }

  // `lockstep status --json` run on `host`; null when it fails.
  nlohmann::json status(const std::string& host) {
    auto result = run_lockstep({"status", "--coordinator", coordinator_address(), "--json"},
                               home(host), 15, {"LOCKSTEP_TOKEN=" + kToken}, hosts->on(host));
    if (result.exit_code != 0 || result.output.find('{') == std::string::npos) return nullptr;
    return nlohmann::json::parse(result.output.substr(result.output.find('{')), nullptr, false);
  }

  // Every rank past `step` (polled for up to 90 s) and the run not near its end.
  ::testing::AssertionResult reached(int64_t step, int64_t well_before) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    int64_t least = -1;
    while ((least = least_step("coord")) < step && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (least < step) return ::testing::AssertionFailure() << "the ranks did not reach step " << step;
    if (least >= well_before) return ::testing::AssertionFailure() << "the run nearly ended (step " << least << "): make it longer";
    return ::testing::AssertionSuccess();
  }

  // A coordinator on host "coord", one worker on each of "w1" and "w2",
  // and a host "spare" for a replacement; all in the folder `shared`.
  struct Pair {
    LockstepProcess& coordinator;
    LockstepProcess& first;
    LockstepProcess& second;
  };
  Pair start_pair(const std::vector<std::string>& sets, const std::string& shared) {
    for (const char* host : {"coord", "w1", "w2", "spare"}) hosts->add(host);
    auto& coordinator = start_coordinator("coord", sets, shared);
    auto& first = start_worker("w1", 0, {}, shared);
    auto& second = start_worker("w2", 0, {}, shared);
    return {coordinator, first, second};
  }

  int64_t least_step(const std::string& host) {
    auto s = status(host);
    if (s.is_null() || s.is_discarded() || s["ranks"].empty()) return -1;
    int64_t least = INT64_MAX;
    for (const auto& r : s["ranks"]) least = std::min(least, r["step"].get<int64_t>());
    return least;
  }

  TempDir dir;
  std::unique_ptr<NetHosts> hosts;  // after dir: its hosts files live there
  std::vector<std::unique_ptr<LockstepProcess>> processes;  // killed before the hosts go
  std::string coordinator_host;
};

const std::vector<std::string> kJob = {"job.threads_per_rank=1", "fault.heartbeat_s=0.5"};

TEST_F(MultiHostTest, TwoWorkerHostsTrainLikeOneHostWithoutASharedFolder) {
  hosts->add("coord");
  hosts->add("debian-like", NetHosts::Names::kLoopback);      // name -> 127.0.1.1
  hosts->add("nameless", NetHosts::Names::kUnresolvable);     // name resolves nowhere
  auto& coordinator = start_coordinator("coord", kJob);
  auto& w1 = start_worker("debian-like", 0);
  auto& w2 = start_worker("nameless", 0, {"GLOO_SOCKET_IFNAME=eth0"});
  ASSERT_EQ(coordinator.wait(150), 0) << coordinator.output() << w1.output() << w2.output();
  EXPECT_EQ(w1.wait(30), 0) << w1.output();
  EXPECT_EQ(w2.wait(30), 0) << w2.output();

  const std::string folder = single_run(home("coord") + "/runs");
  auto manifest = read_json(folder + "/manifest.json");
  EXPECT_EQ(manifest["status"], "completed") << manifest.dump(2);
  const std::string digest = manifest["metrics"].value("final_param_digest", "missing");
  // Every rank's events and audit evidence reached the coordinator's folder.
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(std::filesystem::exists(folder + "/events-rank" + std::to_string(r) + ".jsonl"));
    EXPECT_TRUE(std::filesystem::exists(folder + "/audit-rank" + std::to_string(r) + ".jsonl"));
    // TensorBoard's files too: its scalars, read back, match that rank's events.
    const std::string board = folder + "/tensorboard/rank" + std::to_string(r);
    ASSERT_TRUE(std::filesystem::is_directory(board)) << board;
    std::string file;
    for (const auto& entry : std::filesystem::directory_iterator(board)) file = entry.path().string();
    auto read = python_tool("tb_reader.py", file + " 2>&1");
    EXPECT_EQ(read.exit_code, 0) << read.output;
    EXPECT_NE(read.output.find("\"train/loss\""), std::string::npos) << read.output.substr(0, 400);
  }
  auto report = run_lockstep({"report", folder}, dir.path(), 60);
  EXPECT_EQ(report.exit_code, 0) << report.output;
  EXPECT_EQ(report.output.find("events-rank1.jsonl: missing"), std::string::npos) << report.output;
  auto audit = run_lockstep({"audit", folder}, dir.path(), 30);
  EXPECT_EQ(audit.exit_code, 0) << audit.output;

  // Gloo bound the address on the route to the store, not what the name says.
  const std::string w1_folder = single_run(home("debian-like") + "/runs");
  std::string w1_events;
  for (int r = 0; r < 2; ++r)
    if (std::filesystem::exists(w1_folder + "/events-rank" + std::to_string(r) + ".jsonl"))
      w1_events = w1_folder + "/events-rank" + std::to_string(r) + ".jsonl";
  ASSERT_FALSE(w1_events.empty()) << "the worker host keeps its own events in " << w1_folder;
  EXPECT_EQ(decision(w1_events, "gloo_address"), hosts->address("debian-like"));
  EXPECT_NE(w2.output().find("GLOO_SOCKET_IFNAME = eth0"), std::string::npos) << w2.output();
  EXPECT_NE(w1.output().find("sent to the coordinator"), std::string::npos) << w1.output();

  TempDir local;
  EXPECT_EQ(digest, reference_digest(local, 2, kJob));
}

TEST_F(MultiHostTest, ThreeHostsFourRanksMatchOneHost) {
  hosts->add("alpha");
  hosts->add("beta", NetHosts::Names::kLoopback);
  hosts->add("gamma", NetHosts::Names::kUnresolvable);
  const std::string folder = run_across("alpha", {{"alpha", 0}, {"alpha", 1}, {"beta", 0}, {"gamma", 0}}, kJob);
  ASSERT_FALSE(folder.empty());
  auto manifest = read_json(folder + "/manifest.json");
  EXPECT_EQ(manifest["status"], "completed");
  EXPECT_EQ(manifest["coordinator"]["workers"].size(), 4u);
  auto audit = run_lockstep({"audit", folder}, dir.path(), 30);
  EXPECT_EQ(audit.exit_code, 0) << audit.output;
  TempDir local;
  EXPECT_EQ(manifest["metrics"].value("final_param_digest", "missing"), reference_digest(local, 4, kJob));
}

// Same bits on any number of ranks, across hosts: the cnn with dropout,
// the work fixed by data.global_batch, fp32 and bf16, on 2 hosts of 2
// ranks ends on the digest of 1 host of 4 ranks and of a single rank.
TEST_F(MultiHostTest, TwoHostsOfTwoRanksEndOnTheBitsOfOneHostOfFourAndOfOneRank) {
  hosts->add("left");
  hosts->add("right");
  for (const std::string precision : {"fp32", "bf16"}) {
    std::vector<std::string> sets = kJob;
    sets.insert(sets.end(), {"model.name=cnn", "model.dropout=0.3", "data.global_batch=64", "data.microbatch=16",
                             "job.steps=40", "precision=" + precision});
    const std::string folder = run_across("left", {{"left", 0}, {"left", 1}, {"right", 0}, {"right", 1}}, sets);
    ASSERT_FALSE(folder.empty()) << precision;
    auto manifest = read_json(folder + "/manifest.json");
    const std::string digest = manifest["metrics"].value("final_param_digest", "missing");
    std::filesystem::remove_all(home("left") + "/runs");
    TempDir four, one;
    EXPECT_EQ(digest, reference_digest(four, 4, sets)) << precision << ": 2 hosts x 2 ranks against 1 host x 4";
    EXPECT_EQ(digest, reference_digest(one, 1, sets)) << precision << ": 2 hosts x 2 ranks against 1 rank";
  }
}

TEST_F(MultiHostTest, WorkersMayStartBeforeTheCoordinator) {
  hosts->add("coord");
  hosts->add("early1");
  hosts->add("early2");
  coordinator_host = "coord";
  auto& w1 = start_worker("early1", 0);
  auto& w2 = start_worker("early2", 0);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ASSERT_TRUE(w1.running()) << w1.output();
  ASSERT_TRUE(w2.running()) << w2.output();
  EXPECT_NE(w1.output().find("waiting for the coordinator at " + coordinator_address()),
            std::string::npos) << w1.output();
  auto& coordinator = start_coordinator("coord", kJob);
  EXPECT_EQ(coordinator.wait(150), 0) << coordinator.output();
  EXPECT_EQ(w1.wait(30), 0) << w1.output();
  EXPECT_EQ(w2.wait(30), 0) << w2.output();
}

TEST_F(MultiHostTest, ACutWorkerIsReplacedFromTheCheckpointsOfASharedFolder) {
  // Checkpoints need a folder every host sees: here one folder for all.
  const std::string shared = home("shared");
  auto sets = kJob;
  // Long enough that the cut lands mid-run: a step takes a few ms here, and
  // each status poll starts a process.
  sets.insert(sets.end(), {"job.steps=2000", "checkpoint.every=50", "fault.max_restarts=1",
                           "fault.heartbeat_timeout_s=3", "comm.collective_timeout_s=5",
                           "comm.barrier_timeout_s=10", "audit.every=20"});
  auto [coordinator, survivor, lost] = start_pair(sets, shared);
  ASSERT_TRUE(reached(60, 1500)) << coordinator.output();

  const auto cut_at = std::chrono::steady_clock::now();
  hosts->cut("w2");
  ASSERT_TRUE(coordinator.wait_for_output("Decision: restart = generation 2", 20)) << coordinator.output();
  const double noticed = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut_at).count();
  EXPECT_LE(noticed, 3.0 + 2.0) << "fault.heartbeat_timeout_s = 3";
  auto& spare = start_worker("spare", 0, {}, shared);  // the cluster's supervisor, by hand
  ASSERT_EQ(coordinator.wait(180), 0) << coordinator.output() << "\n--- the survivor (w1):\n"
                                      << survivor.output() << "\n--- the spare:\n" << spare.output();
  EXPECT_NE(lost.wait(30), 0) << "the cut-off worker ends by itself: " << lost.output();

  auto manifest = read_json(single_run(shared + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["restart_count"], 1);
  TempDir local;
  EXPECT_EQ(manifest["metrics"].value("final_param_digest", "missing"), reference_digest(local, 2, sets));
}

// The defaults only (comm.collective_timeout_s = 300, fault.heartbeat_timeout_s
// = 10, comm.rendezvous_timeout_s = 120, no checkpoints): the survivor of a
// cut link is in a collective that would wait 300 s for its peer; when the
// coordinator ends the generation, it leaves it and rejoins, and a
// replacement on another host completes the job at the same world size.
TEST_F(MultiHostTest, ACutLinkWithTheDefaultsIsRecoveredByAReplacementAtTheSameWorldSize) {
  const std::string shared = home("shared");  // a resume reads the run folder
  auto sets = kJob;
  sets.insert(sets.end(), {"job.steps=3000"});
  auto [coordinator, survivor, lost] = start_pair(sets, shared);
  ASSERT_TRUE(reached(60, 2500)) << coordinator.output();

  const auto cut_at = std::chrono::steady_clock::now();
  hosts->cut("w2");
  ASSERT_TRUE(coordinator.wait_for_output("Decision: restart = generation 2", 10 + 3)) << coordinator.output();
  ASSERT_TRUE(survivor.wait_for_output("joining the next generation", 5)) << survivor.output();
  const double left = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut_at).count();
  EXPECT_LE(left, 10.0 + 5.0) << "fault.heartbeat_timeout_s = 10: the survivor left its collective "
                              << left << " s after the cut";
  EXPECT_NE(survivor.output().find("shut down"), std::string::npos) << survivor.output();
  auto& spare = start_worker("spare", 0, {}, shared);  // the cluster's supervisor, by hand
  ASSERT_EQ(coordinator.wait(120), 0) << coordinator.output() << "\n--- the survivor (w1):\n"
                                      << survivor.output() << "\n--- the spare:\n" << spare.output();
  EXPECT_EQ(survivor.wait(30), 0) << survivor.output();
  EXPECT_NE(lost.wait(30), 0) << "the cut-off worker ends by itself: " << lost.output();
  std::printf("cut link with the defaults: the survivor left its collective %.1f s after the cut\n", left);

  auto manifest = read_json(single_run(shared + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["restart_count"], 1);
  EXPECT_EQ(manifest["world_size"], 2);
  TempDir local;
  EXPECT_EQ(manifest["metrics"].value("final_param_digest", "missing"), reference_digest(local, 2, sets));
}

// A rank frozen (SIGSTOP) beyond the heartbeat timeout is declared lost; the
// survivor leaves its collective, a replacement joins. Thawed, the frozen
// process is refused with a message, never merged into the new generation.
TEST_F(MultiHostTest, AFrozenRankIsDeclaredLostAndRefusedWhenItThaws) {
  const std::string shared = home("shared");
  auto sets = kJob;
  sets.insert(sets.end(), {"job.steps=3000", "fault.heartbeat_timeout_s=3", "checkpoint.every=100"});
  auto [coordinator, survivor, frozen] = start_pair(sets, shared);
  ASSERT_TRUE(reached(150, 2500)) << coordinator.output();

  const auto frozen_at = std::chrono::steady_clock::now();
  frozen.signal(SIGSTOP);
  ASSERT_TRUE(coordinator.wait_for_output("Decision: restart = generation 2", 3 + 3)) << coordinator.output();
  ASSERT_TRUE(survivor.wait_for_output("joining the next generation", 5)) << survivor.output();
  EXPECT_LE(std::chrono::duration<double>(std::chrono::steady_clock::now() - frozen_at).count(), 3.0 + 5.0);
  auto& spare = start_worker("spare", 0, {}, shared);
  ASSERT_TRUE(coordinator.wait_for_output("generation 2 of run", 60)) << coordinator.output();
  frozen.signal(SIGCONT);
  EXPECT_EQ(frozen.wait(30), 1) << frozen.output();
  EXPECT_NE(frozen.output().find("declared lost"), std::string::npos) << frozen.output();
  ASSERT_EQ(coordinator.wait(120), 0) << coordinator.output() << "\n--- the survivor (w1):\n"
                                      << survivor.output() << "\n--- the spare:\n" << spare.output();
  auto manifest = read_json(single_run(shared + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["restart_count"], 1);
  TempDir local;
  EXPECT_EQ(manifest["metrics"].value("final_param_digest", "missing"), reference_digest(local, 2, sets));
}

// An elastic job (elastic.min_ranks = 2; 4 microbatches a step, so 4, 2 or
// 1 ranks divide them), 4 ranks on two hosts of two; the defaults
// otherwise. One host's link is cut mid-run: the survivors go on as 2 ranks
// from the step they stopped at, with the state they hold in memory; the
// link comes back and the host's workers are started again: the job grows
// back to 4, the new ranks getting the state from a live peer. The run
// ends on the bits of the uninterrupted 4-rank run.
class ElasticTest : public MultiHostTest {
 protected:
  std::vector<std::string> elastic_job() const {
    auto sets = kJob;
    sets.insert(sets.end(), {"job.steps=2000", "data.global_batch=64", "data.microbatch=16",
                             "elastic.min_ranks=2", "elastic.replace_wait_s=2", "audit.every=500"});
    return sets;
  }
  // The elastic job (`sets`, job.world_size = 4 added) on hosts "a" and "b",
  // two workers each (processes[1..4]: a0, a1, b0, b1), its coordinator on
  // "coord"; returns once 4 ranks train past step 100 (false recorded otherwise).
  LockstepProcess* start_four(std::vector<std::string>& sets) {
    for (const char* host : {"coord", "a", "b"}) hosts->add(host);
    sets.push_back("job.world_size=4");
    auto& coordinator = start_coordinator("coord", sets);
    for (const auto& host : {"a", "b"})
      for (int local = 0; local < 2; ++local) start_worker(host, local);
    if (!wait_for_world(4, 100, 90)) {
      ADD_FAILURE() << "4 ranks did not get past step 100: " << coordinator.output();
      return nullptr;
    }
    return &coordinator;
  }
  // Waits until the coordinator's status says `world` ranks run at least `steps` past `after`.
  bool wait_for_world(int world, int64_t after, double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      auto s = status("coord");
      if (!s.is_null() && !s.is_discarded() && s.value("state", "") == "running" && s.value("world_size", 0) == world &&
          int(s["ranks"].size()) == world) {
        int64_t least = INT64_MAX;
        for (const auto& r : s["ranks"]) least = std::min(least, r["step"].get<int64_t>());
        if (least > after) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    return false;
  }
};

TEST_F(ElasticTest, ACutHostShrinksTheJobToTwoRanksAndItsReturnGrowsItBackOnTheSameBits) {
  auto sets = elastic_job();
  LockstepProcess* started = start_four(sets);
  ASSERT_NE(started, nullptr);
  auto& coordinator = *started;

  const auto cut_at = std::chrono::steady_clock::now();
  hosts->cut("b");
  ASSERT_TRUE(wait_for_world(2, 0, 10 + 10 + 30)) << coordinator.output();
  const double shrunk = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut_at).count();
  EXPECT_LE(shrunk, 10.0 + 10.0) << "fault.heartbeat_timeout_s = 10: on 2 ranks " << shrunk << " s after the cut";
  EXPECT_TRUE(coordinator.wait_for_output("Decision: world_size = 2", 1)) << coordinator.output();
  EXPECT_NE(processes[1]->output().find("Decision: resume_from = memory"), std::string::npos) << processes[1]->output();
  // b's workers, cut off from the coordinator, end by themselves.
  EXPECT_NE(processes[3]->wait(30), -1) << processes[3]->output();
  EXPECT_NE(processes[4]->wait(30), -1) << processes[4]->output();
  hosts->restore("b");
  const auto back_at = std::chrono::steady_clock::now();
  start_worker("b", 0);
  start_worker("b", 1);
  ASSERT_TRUE(wait_for_world(4, 0, 60)) << coordinator.output();
  const double grown = std::chrono::duration<double>(std::chrono::steady_clock::now() - back_at).count();
  EXPECT_TRUE(coordinator.wait_for_output("Decision: regroup", 1)) << coordinator.output();
  ASSERT_EQ(coordinator.wait(180), 0) << coordinator.output();
  for (size_t p = 1; p < processes.size(); ++p)
    if (p != 3 && p != 4) EXPECT_EQ(processes[p]->wait(30), 0) << processes[p]->output();
  std::printf("elastic: on 2 ranks %.1f s after the cut, back on 4 ranks %.1f s after b's workers started\n",
              shrunk, grown);

  const std::string run = single_run(home("coord") + "/runs");
  auto manifest = read_json(run + "/manifest.json");
  const auto& membership = manifest["coordinator"]["membership"];
  ASSERT_EQ(membership.size(), 2u) << manifest["coordinator"].dump(1);
  EXPECT_EQ(membership[0]["world_size_before"], 4);
  EXPECT_EQ(membership[0]["world_size"], 2);
  EXPECT_EQ(membership[1]["world_size"], 4);
  EXPECT_EQ(membership[1]["kind"], "regroup");
  TempDir local;
  EXPECT_EQ(manifest["metrics"].value("final_param_digest", "missing"), reference_digest(local, 4, sets));
  // The audit checks agreement across the changes (each step among the
  // ranks it had); compare finds the uninterrupted run's bits at every
  // audited step.
  auto audit = run_lockstep({"audit", run}, home("coord"), 60);
  EXPECT_EQ(audit.exit_code, 0) << audit.output;
  EXPECT_NE(audit.output.find("ranks (2, 4 over the run) agreed"), std::string::npos) << audit.output;
  auto compare = run_lockstep({"compare", single_run(local.path() + "/runs"), run}, home("coord"), 60);
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
  EXPECT_NE(compare.output.find("bit-identical"), std::string::npos) << compare.output;
}

// SIGKILL of one rank: 3 survivors, but 3 does not divide 4 microbatches:
// 2 go on, the third stands by; one new worker makes 4 again.
TEST_F(ElasticTest, AKilledRankLeavesTwoRanksAndAStandbyAndANewWorkerMakesFourOnTheSameBits) {
  auto sets = elastic_job();
  LockstepProcess* started = start_four(sets);
  ASSERT_NE(started, nullptr);
  auto& coordinator = *started;
  const auto killed_at = std::chrono::steady_clock::now();
  processes[4]->signal(SIGKILL);
  ASSERT_TRUE(wait_for_world(2, 0, 10 + 10 + 30)) << coordinator.output();
  const double shrunk = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LE(shrunk, 10.0 + 10.0) << "on 2 ranks " << shrunk << " s after the kill";
  EXPECT_TRUE(coordinator.wait_for_output("waits as a standby", 1)) << coordinator.output();
  start_worker("b", 1);
  ASSERT_TRUE(wait_for_world(4, 0, 60)) << coordinator.output();
  ASSERT_EQ(coordinator.wait(180), 0) << coordinator.output();
  std::printf("elastic, SIGKILL: on 2 ranks %.1f s after the kill\n", shrunk);
  auto manifest = read_json(single_run(home("coord") + "/runs") + "/manifest.json");
  const auto& membership = manifest["coordinator"]["membership"];
  ASSERT_EQ(membership.size(), 2u) << manifest["coordinator"].dump(1);
  EXPECT_EQ(membership[0]["world_size"], 2);
  EXPECT_EQ(membership[1]["world_size"], 4);
  TempDir local;
  EXPECT_EQ(manifest["metrics"].value("final_param_digest", "missing"), reference_digest(local, 4, sets));
}

// SIGSTOP of one rank beyond the heartbeat timeout: lost like a dead one,
// the job goes on with 2; a new worker grows it back to 4; thawed, the
// frozen process is refused, never merged, and the run keeps its bits.
TEST_F(ElasticTest, AFrozenRankIsLostTheJobShrinksAndTheThawedProcessIsRefused) {
  auto sets = elastic_job();
  LockstepProcess* started = start_four(sets);
  ASSERT_NE(started, nullptr);
  auto& coordinator = *started;
  auto& frozen = *processes[4];
  const auto frozen_at = std::chrono::steady_clock::now();
  frozen.signal(SIGSTOP);
  ASSERT_TRUE(wait_for_world(2, 0, 10 + 10 + 30)) << coordinator.output();
  const double shrunk = std::chrono::duration<double>(std::chrono::steady_clock::now() - frozen_at).count();
  EXPECT_LE(shrunk, 10.0 + 10.0) << "on 2 ranks " << shrunk << " s after the freeze";
  start_worker("b", 1);
  ASSERT_TRUE(wait_for_world(4, 0, 60)) << coordinator.output();
  frozen.signal(SIGCONT);
  EXPECT_EQ(frozen.wait(30), 1) << frozen.output();
  EXPECT_NE(frozen.output().find("declared lost"), std::string::npos) << frozen.output();
  ASSERT_EQ(coordinator.wait(180), 0) << coordinator.output();
  std::printf("elastic, SIGSTOP: on 2 ranks %.1f s after the freeze\n", shrunk);
  auto manifest = read_json(single_run(home("coord") + "/runs") + "/manifest.json");
  ASSERT_EQ(manifest["coordinator"]["membership"].size(), 2u) << manifest["coordinator"].dump(1);
  TempDir local;
  EXPECT_EQ(manifest["metrics"].value("final_param_digest", "missing"), reference_digest(local, 4, sets));
}

// Below elastic.min_ranks: 12 microbatches a step (4 or 3 ranks), at least
// 3; a cut host leaves 2. The job fails saying so, after the wait for a
// replacement; its manifest says why and its newest checkpoint verifies.
TEST_F(ElasticTest, ALossBelowTheMinimumFailsTheJobAndKeepsItsCheckpoints) {
  hosts->add("coord");
  hosts->add("a");
  hosts->add("b");
  const std::string shared = home("shared");
  auto sets = kJob;
  sets.insert(sets.end(), {"job.world_size=4", "job.steps=100000", "data.global_batch=96", "data.microbatch=8",
                           "elastic.min_ranks=3", "elastic.replace_wait_s=2", "checkpoint.every=50",
                           "fault.heartbeat_timeout_s=3"});
  auto& coordinator = start_coordinator("coord", sets, shared);
  for (const auto& host : {"a", "b"})
    for (int local = 0; local < 2; ++local) start_worker(host, local, {}, shared);
  ASSERT_TRUE(wait_for_world(4, 120, 90)) << coordinator.output();
  hosts->cut("b");
  EXPECT_EQ(coordinator.wait(60), 1) << coordinator.output();
  for (size_t p = 1; p < processes.size(); ++p) EXPECT_NE(processes[p]->wait(30), -1) << processes[p]->output();
  const std::string run = single_run(shared + "/runs");
  auto manifest = read_json(run + "/manifest.json");
  EXPECT_EQ(manifest["status"], "failed");
  const std::string failure = manifest["coordinator"].value("failure", "");
  EXPECT_NE(failure.find("fewer than elastic.min_ranks = 3"), std::string::npos) << failure;
  EXPECT_NE(failure.find("elastic.replace_wait_s = 2"), std::string::npos) << failure;
  std::vector<std::string> rejected;
  const auto newest = CheckpointStore(run + "/checkpoints").newest_valid(&rejected);
  ASSERT_TRUE(newest.has_value()) << "no checkpoint verifies";
  EXPECT_GE(newest->step, 100);
}

// A rank whose processor computes one bit wrong (fault bitflip_grad on
// rank 2, host b): the cross-check at that step names it, and under
// audit.on_miscompute = exclude the job goes on without host b from the
// state before the step, checks the step again and ends on the bits of the
// run that nothing happened to; `lockstep verify` replays the whole run,
// 4 ranks then 2, on one rank and confirms every digest.
TEST_F(ElasticTest, AHostThatComputesWrongIsExcludedAndTheRunEndsOnVerifiedBits) {
  for (const char* host : {"coord", "a", "b"}) hosts->add(host);
  auto clean = kJob;
  clean.insert(clean.end(), {"job.steps=300", "data.global_batch=64", "data.microbatch=16", "elastic.min_ranks=2",
                             "elastic.replace_wait_s=2", "audit.verify_every=50"});
  auto sets = clean;
  sets.insert(sets.end(), {"job.world_size=4", "audit.on_miscompute=exclude", "fault.inject=bitflip_grad:fc1.weight:2:150"});
  auto& coordinator = start_coordinator("coord", sets);
  for (const auto& host : {"a", "b"})
    for (int local = 0; local < 2; ++local) start_worker(host, local);
  ASSERT_EQ(coordinator.wait(180), 0) << coordinator.output();
  const std::string out = coordinator.output();
  EXPECT_NE(out.find("MISCOMPUTE at step 150, microbatch 2: rank 2 (b) computed it"), std::string::npos) << out;
  EXPECT_NE(out.find("Decision: exclude = b"), std::string::npos) << out;
  // a's workers finish; b's are refused when they rejoin, saying why.
  for (size_t p : {1, 2}) EXPECT_EQ(processes[p]->wait(30), 0) << processes[p]->output();
  for (size_t p : {3, 4}) {
    EXPECT_EQ(processes[p]->wait(30), 1) << processes[p]->output();
    const std::string said = processes[p]->output();
    EXPECT_TRUE(said.find("was excluded from this job") != std::string::npos ||
                said.find("excluded: it computed wrong") != std::string::npos) << said;
  }
  const std::string run = single_run(home("coord") + "/runs");
  auto manifest = read_json(run + "/manifest.json");
  const auto& membership = manifest["coordinator"]["membership"];
  ASSERT_EQ(membership.size(), 1u) << manifest["coordinator"].dump(1);
  EXPECT_EQ(membership[0]["world_size"], 2);
  EXPECT_EQ(manifest["world_size"], 2);
  for (const auto& r : manifest["ranks"]) EXPECT_EQ(r["host"].get<std::string>().rfind("a", 0), 0u) << manifest["ranks"];
  EXPECT_GE(manifest["metrics"].value("cross_checks", 0), 1);  // the step done again was checked
  TempDir local;
  clean.push_back("job.world_size=4");
  EXPECT_EQ(manifest["metrics"].value("final_param_digest", "missing"), reference_digest(local, 4, clean));
  auto verify = run_lockstep({"verify", run}, home("coord"), 120);
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_NE(verify.output.find("VERIFIED steps 1 to 300: 300 steps"), std::string::npos) << verify.output;
}

TEST_F(MultiHostTest, WorkersEndWhenTheCoordinatorHostIsCutOff) {
  hosts->add("coord");
  hosts->add("w1");
  hosts->add("w2");
  auto sets = kJob;
  sets.insert(sets.end(), {"job.steps=100000", "fault.heartbeat_timeout_s=3"});
  start_coordinator("coord", sets);
  auto& w1 = start_worker("w1", 0);
  auto& w2 = start_worker("w2", 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (least_step("coord") < 5 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_GE(least_step("coord"), 5);
  hosts->cut("coord");
  const auto cut_at = std::chrono::steady_clock::now();
  EXPECT_NE(w1.wait(3 + 5), -1) << "still running 8 s after the cut: " << w1.output();
  EXPECT_NE(w2.wait(1), -1) << w2.output();
  const double ended = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut_at).count();
  EXPECT_LE(ended, 3.0 + 5.0);
  EXPECT_NE(w1.output().find("coordinator"), std::string::npos) << w1.output();
}

TEST_F(MultiHostTest, AnInterfaceOrAddressNotOnTheHostIsBadInput) {
  hosts->add("coord");
  hosts->add("w1");
  for (const std::string& wrong : {"nosuch0", "10.99.99.99"}) {
    auto sets = kJob;
    sets.push_back("comm.interface=" + wrong);
    sets.push_back("job.world_size=1");
    TempDir run_dir;
    auto& coordinator = start_coordinator("coord", sets, run_dir.path());
    auto& worker = start_worker("w1", 0, {}, run_dir.path());
    EXPECT_EQ(worker.wait(60), 2) << worker.output();
    EXPECT_NE(worker.output().find("'" + wrong + "', which is neither an interface nor an address"),
              std::string::npos) << worker.output();
    EXPECT_NE(worker.output().find("eth0 (" + hosts->address("w1") + ")"), std::string::npos)
        << "the error lists the host's interfaces: " << worker.output();
    EXPECT_NE(coordinator.wait(30), -1);
  }
}

// Without namespaces: the CPU limits a worker derives its threads from.
TEST(WorkerThreads, TasksetAndOmpNumThreadsLimitTheDerivedThreads) {
  for (const auto& [prefix, env] :
       {std::pair{std::vector<std::string>{"taskset", "-c", "0"}, std::vector<std::string>{}},
        std::pair{std::vector<std::string>{}, std::vector<std::string>{"OMP_NUM_THREADS=1"}}}) {
    TempDir dir;
    auto result = run_lockstep(synthetic_run(dir, 1, {"job.steps=2"}), dir.path(), 120, env, prefix);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const std::string events = single_run(dir.path() + "/runs") + "/events-rank0.jsonl";
    EXPECT_EQ(decision(events, "intra_op_threads"), "1") << result.output;
  }
}

TEST(Rendezvous, AnUnreachableCoordinatorFailsAfterTheRendezvousTimeoutNamingIt) {
  TempDir dir;
  const int port = free_port();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto result = run_lockstep({"worker", "--coordinator", address, "--rendezvous-timeout", "2"},
                             dir.path(), 30, {"LOCKSTEP_TOKEN=" + kToken});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_GE(result.seconds, 2.0);
  EXPECT_LE(result.seconds, 15.0);
  EXPECT_NE(result.output.find("the coordinator at " + address + " could not be reached for 2 s"),
            std::string::npos) << result.output;
}

}  // namespace
}  // namespace lockstep::testing

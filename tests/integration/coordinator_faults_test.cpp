// Faults around the coordinator, with real processes and real gRPC: a worker
// killed or hung mid-training, the coordinator killed, and hostile or
// mistaken clients. Nothing may hang and nothing may be left running.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "integration/cluster.h"

namespace lockstep::testing {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

// A long job with a 3 s heartbeat timeout: the faults come in the middle.
const std::vector<std::string> kLongJob = {"job.steps=100000", "fault.heartbeat_s=0.5",
                                           "fault.heartbeat_timeout_s=3",
                                           "comm.collective_timeout_s=120",
                                           "fault.max_restarts=0"};

void lose_a_worker(int signal_number) {
  TempDir dir;
  Cluster cluster(dir, kLongJob);
  cluster.add_worker();
  cluster.add_worker();
  ASSERT_TRUE(cluster.wait_for_steps(5, 60)) << cluster.coordinator->output();
  // Which process is rank 1? The coordinator knows its pid.
  pid_t victim_pid = 0;
  const v1::StatusReply running = cluster.status();
  for (const auto& r : running.ranks())
    if (r.rank() == 1) victim_pid = r.pid();
  LockstepProcess* victim = nullptr;
  LockstepProcess* survivor = nullptr;
  for (auto& w : cluster.workers) (w->pid() == victim_pid ? victim : survivor) = w.get();
  ASSERT_TRUE(victim && survivor);

  const auto start = Clock::now();
  victim->signal(signal_number);
  ASSERT_TRUE(cluster.coordinator->wait_for_output("rank 1 (", 3 + 2 + 1)) << cluster.coordinator->output();
  ASSERT_TRUE(cluster.coordinator->wait_for_output("declared dead", 3 + 2))
      << cluster.coordinator->output();
  const double declared = since(start);
  EXPECT_LE(declared, 3.0 + 2.0) << "declared dead after " << declared << " s";

  EXPECT_EQ(survivor->wait(5 + 1), 1) << survivor->output();
  const double survivor_gone = since(start);
  EXPECT_LE(survivor_gone - declared, 5.0);
  EXPECT_NE(survivor->output().find("rank 1 ("), std::string::npos) << survivor->output();
  EXPECT_NE(survivor->output().find("is dead"), std::string::npos) << survivor->output();
  EXPECT_EQ(cluster.coordinator->wait(15), 1) << cluster.coordinator->output();
  std::printf("signal %d: declared dead after %.2f s, survivor gone after %.2f s\n", signal_number,
              declared, survivor_gone);

  if (signal_number == SIGSTOP) victim->kill_group();  // a hung process is ours to end
  EXPECT_GE(victim->wait(10), 0);
  for (auto* p : {victim, survivor, cluster.coordinator.get()}) EXPECT_FALSE(alive(p->pid()));
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "failed");
  EXPECT_NE(manifest["coordinator"]["failure"].get<std::string>().find("rank 1"), std::string::npos);
  // Each rank's last known state, none still "running".
  for (const auto& w : manifest["coordinator"]["workers"]) {
    EXPECT_NE(w["state"], "running") << w.dump();
    EXPECT_EQ(w["state"], w["rank"] == 1 ? "dead" : "aborted") << w.dump();
  }
}

TEST(CoordinatorFaults, KilledWorkerIsDeclaredDeadAndTheOtherLeaves) { lose_a_worker(SIGKILL); }

TEST(CoordinatorFaults, HungWorkerIsDeclaredDeadAndTheOtherLeaves) { lose_a_worker(SIGSTOP); }

TEST(CoordinatorFaults, WorkersStopThemselvesWhenTheCoordinatorDies) {
  TempDir dir;
  Cluster cluster(dir, kLongJob);
  auto& a = cluster.add_worker();
  auto& b = cluster.add_worker();
  ASSERT_TRUE(cluster.wait_for_steps(5, 60)) << cluster.coordinator->output();
  const auto start = Clock::now();
  cluster.coordinator->kill_group();
  EXPECT_EQ(a.wait(3 + 5), 1) << a.output();
  EXPECT_EQ(b.wait(3 + 5), 1) << b.output();
  EXPECT_LE(since(start), 3.0 + 5.0);
  EXPECT_NE(a.output().find("lost the coordinator"), std::string::npos) << a.output();
  EXPECT_FALSE(alive(a.pid()));
  EXPECT_FALSE(alive(b.pid()));
  // Nothing is left saying the job runs: rank 0, the manifest's writer,
  // recorded why it ended.
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "failed") << manifest.dump(2);
  // As the error, or beside a collective's error that came first (a peer
  // that had already left for the same reason).
  EXPECT_NE((manifest.value("error", "") + manifest.value("coordinator_lost", "")).find("lost the coordinator"),
            std::string::npos)
      << manifest.dump(2);
  EXPECT_NE(manifest.value("finished_at", ""), "");
}

TEST(CoordinatorFaults, AWorkerKilledWhileWaitingInJoinFreesItsPlace) {
  TempDir dir;
  Cluster cluster(dir, {"job.steps=30", "fault.heartbeat_s=0.2"});
  auto& lost = cluster.add_worker();
  ASSERT_TRUE(cluster.coordinator->wait_for_output("join 1 of 2", 30)) << cluster.coordinator->output();
  const pid_t lost_pid = lost.pid();
  lost.kill_group();
  EXPECT_TRUE(cluster.coordinator->wait_for_output("went away (its Join was cancelled) before the job "
                                                   "started: its place is free again (0 of 2 joined)", 10))
      << cluster.coordinator->output();
  EXPECT_EQ(cluster.status().joined(), 0);
  auto& a = cluster.add_worker();
  auto& b = cluster.add_worker();
  EXPECT_EQ(cluster.coordinator->wait(90), 0) << cluster.coordinator->output();
  EXPECT_EQ(a.wait(30), 0) << a.output();
  EXPECT_EQ(b.wait(30), 0) << b.output();
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "completed");
  for (const auto& w : manifest["coordinator"]["workers"]) EXPECT_NE(w["pid"], lost_pid) << w.dump();
}

TEST(CoordinatorFaults, BadClientsAreRefusedAndTheJobGoesOn) {
  TempDir dir;
  // Without restarts a third worker is refused (with them, it would wait
  // as a replacement for the next generation).
  Cluster cluster(dir, {"job.steps=100000", "fault.heartbeat_s=0.5", "fault.max_restarts=0"});
  cluster.add_worker();
  cluster.add_worker();
  ASSERT_TRUE(cluster.wait_for_steps(5, 60)) << cluster.coordinator->output();
  const int64_t before = cluster.min_step();

  v1::StatusReply status;
  auto wrong = cluster.client("not-the-token").status(&status, std::chrono::seconds(5));
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED) << describe(wrong);

  v1::JoinRequest join;
  join.set_api_version("lockstep.v1");
  join.set_hostname("intruder");
  join.set_local_rank(0);
  v1::JoinReply reply;
  auto third = cluster.client().join(join, &reply, std::chrono::seconds(5));
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << describe(third);

  auto unknown = join;
  unknown.set_run_id("some-other-run");
  EXPECT_EQ(cluster.client().join(unknown, &reply, std::chrono::seconds(5)).error_code(),
            grpc::StatusCode::NOT_FOUND);
  auto old = join;
  old.set_api_version("lockstep.v0");
  auto version = cluster.client().join(old, &reply, std::chrono::seconds(5));
  EXPECT_EQ(version.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(version.error_message().find("lockstep.v1"), std::string::npos);

  auto huge = join;
  huge.set_hostname(std::string(2 << 20, 'x'));  // 2 MiB, over the 1 MiB limit
  auto oversized = cluster.client().join(huge, &reply, std::chrono::seconds(5));
  EXPECT_EQ(oversized.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << describe(oversized);

  // Garbage bytes straight onto the port.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(cluster.port));
  ::inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  std::string garbage(4096, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = char(i * 131 + 7);
  EXPECT_GT(::write(fd, garbage.data(), garbage.size()), 0);
  char answer[256];
  (void)::read(fd, answer, sizeof answer);  // the server answers or hangs up; either is fine
  ::close(fd);

  // The job never noticed: its steps keep advancing.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_TRUE(cluster.wait_for_steps(before + 20, 20)) << cluster.coordinator->output();
  auto now = cluster.status();
  EXPECT_EQ(now.state(), "running");
  EXPECT_EQ(now.ranks_size(), 2);
  EXPECT_NE(cluster.coordinator->output().find("wrong job token"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::testing

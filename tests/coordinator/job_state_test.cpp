#include "coordinator/job_state.h"

#include <future>
#include <thread>

#include <gtest/gtest.h>

namespace lockstep {
namespace {

using Clock = JobState::Clock;

JobStateOptions options(int world, int rendezvous_ms = 5000) {
  JobStateOptions o;
  o.run_id = "run-1";
  o.world_size = world;
  o.settings = {"job.steps=3"};
  o.rendezvous_timeout = std::chrono::milliseconds(rendezvous_ms);
  o.heartbeat_timeout = std::chrono::milliseconds(300);
  return o;
}

v1::JoinRequest request(const std::string& host, int local_rank, int pid) {
  v1::JoinRequest r;
  r.set_api_version("lockstep.v1");
  r.set_hostname(host);
  r.set_local_rank(local_rank);
  r.set_pid(pid);
  return r;
}

// Joins from a thread; the call blocks until the job is full.
std::future<std::pair<grpc::Status, v1::JoinReply>> join_async(JobState& state, v1::JoinRequest r) {
  return std::async(std::launch::async, [&state, r] {
    v1::JoinReply reply;
    auto status = state.join(r, "test", Clock::now() + std::chrono::seconds(10), &reply);
    return std::make_pair(status, reply);
  });
}

TEST(JobState, RanksFollowHostThenLocalRankNotJoinOrder) {
  JobState state(options(3));
  auto c = join_async(state, request("host-b", 0, 30));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto b = join_async(state, request("host-a", 1, 20));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto a = join_async(state, request("host-a", 0, 10));
  auto [sa, ra] = a.get();
  auto [sb, rb] = b.get();
  auto [sc, rc] = c.get();
  ASSERT_TRUE(sa.ok() && sb.ok() && sc.ok()) << sa.error_message();
  EXPECT_EQ(ra.rank(), 0);
  EXPECT_EQ(rb.rank(), 1);
  EXPECT_EQ(rc.rank(), 2);
  EXPECT_EQ(ra.local_world_size(), 2);
  EXPECT_EQ(rc.local_world_size(), 1);
  EXPECT_EQ(ra.generation(), 1);
  EXPECT_EQ(ra.settings_size(), 1);
  EXPECT_EQ(state.state(), JobState::State::kRunning);
}

TEST(JobState, RejectionsCarryTheirStatus) {
  JobState state(options(2));
  v1::JoinReply reply;
  auto old = request("h", 0, 1);
  old.set_api_version("lockstep.v0");
  EXPECT_EQ(state.join(old, "p", Clock::now(), &reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  auto other_run = request("h", 0, 1);
  other_run.set_run_id("run-2");
  EXPECT_EQ(state.join(other_run, "p", Clock::now(), &reply).error_code(),
            grpc::StatusCode::NOT_FOUND);

  auto first = request("h", 0, 1);
  first.set_claimed_rank(1);
  auto pending = join_async(state, first);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto duplicate = request("h", 1, 2);
  duplicate.set_claimed_rank(1);
  auto refused = state.join(duplicate, "p", Clock::now(), &reply);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("rank 1 is already claimed"), std::string::npos);
  EXPECT_EQ(state.join(request("h", 0, 3), "p", Clock::now(), &reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);  // same host + local rank

  auto second = join_async(state, request("h", 1, 4));
  EXPECT_EQ(pending.get().second.rank(), 1);  // the claim holds
  EXPECT_EQ(second.get().second.rank(), 0);
  EXPECT_EQ(state.join(request("h", 2, 5), "p", Clock::now(), &reply).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST(JobState, SilentRankIsDeclaredDeadAndOthersAreToldToAbort) {
  JobState state(options(2));
  auto a = join_async(state, request("h", 0, 1));
  auto b = join_async(state, request("h", 1, 2));
  a.get();
  b.get();
  v1::HeartbeatRequest beat;
  beat.set_run_id("run-1");
  beat.set_generation(1);
  beat.set_rank(0);
  beat.set_step(7);
  const auto start = Clock::now();
  while (state.state() == JobState::State::kRunning && Clock::now() - start < std::chrono::seconds(3)) {
    v1::HeartbeatReply reply;
    ASSERT_TRUE(state.heartbeat(beat, &reply).ok());
    state.check_liveness();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(state.state(), JobState::State::kFailed);
  EXPECT_NE(state.failure().find("rank 1"), std::string::npos) << state.failure();
  EXPECT_NE(state.failure().find("is dead"), std::string::npos) << state.failure();
  v1::HeartbeatReply reply;
  ASSERT_TRUE(state.heartbeat(beat, &reply).ok());
  EXPECT_EQ(reply.command(), v1::HeartbeatReply::ABORT);
  EXPECT_NE(reply.reason().find("rank 1"), std::string::npos);
}

TEST(JobState, RendezvousTimeoutNamesWhoJoined) {
  JobState state(options(2, 300));
  v1::JoinReply reply;
  auto status = state.join(request("host-x", 0, 42), "peer-x", Clock::now() + std::chrono::seconds(5),
                           &reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_NE(status.error_message().find("rendezvous timed out"), std::string::npos);
  EXPECT_NE(status.error_message().find("1 of 2 joined: host-x (pid 42"), std::string::npos)
      << status.error_message();
}

}  // namespace
}  // namespace lockstep

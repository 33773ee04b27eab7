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

v1::HeartbeatReply beat_from(JobState& state, int rank, int64_t generation) {
  v1::HeartbeatRequest beat;
  beat.set_run_id("run-1");
  beat.set_generation(generation);
  beat.set_rank(rank);
  v1::HeartbeatReply reply;
  EXPECT_TRUE(state.heartbeat(beat, &reply).ok());
  return reply;
}

// Rank 0 of generation 1 heartbeats, rank 1 stays silent, and the liveness
// monitor runs, until the job is no longer running (at most 3 s).
void rank_zero_beats_until_rank_one_is_lost(JobState& state) {
  const auto start = Clock::now();
  while (state.state() == JobState::State::kRunning && Clock::now() - start < std::chrono::seconds(3)) {
    beat_from(state, 0, 1);
    state.check_liveness();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

TEST(JobState, LostWorkerStartsANewGenerationThatResumesUntilTheBudgetIsSpent) {
  auto o = options(2);
  o.max_restarts = 1;
  JobState state(o);
  auto a = join_async(state, request("h", 0, 10));
  auto b = join_async(state, request("h", 1, 11));
  ASSERT_FALSE(a.get().second.resume());
  b.get();
  EXPECT_TRUE(state.process_ended(11, "was killed by signal 9", false));
  EXPECT_EQ(state.state(), JobState::State::kWaiting);
  v1::StatusReply status;
  state.status(&status);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_EQ(status.restarts(), 1);
  EXPECT_EQ(status.max_restarts(), 1);
  // The survivor of generation 1 is told to rejoin, naming the reason.
  auto told = beat_from(state, 0, 1);
  EXPECT_EQ(told.command(), v1::HeartbeatReply::REJOIN);
  EXPECT_NE(told.reason().find("rank 1 (h pid 11) was killed by signal 9"), std::string::npos)
      << told.reason();

  auto back = request("h", 0, 10);
  back.set_previous_generation(1);
  auto a2 = join_async(state, back);
  auto b2 = join_async(state, request("h", 1, 12));
  auto [sa, ra] = a2.get();
  auto [sb, rb] = b2.get();
  ASSERT_TRUE(sa.ok() && sb.ok()) << sa.error_message() << sb.error_message();
  EXPECT_EQ(ra.generation(), 2);
  EXPECT_EQ(ra.rank(), 0);
  EXPECT_EQ(rb.rank(), 1);
  EXPECT_TRUE(ra.resume() && rb.resume());
  auto view = state.to_json();
  EXPECT_EQ(view["restarts"][0]["dead_rank"], 1);
  EXPECT_EQ(view["earlier_generations"][0]["generation"], 1);
  for (const auto& w : view["workers"])
    EXPECT_EQ(w["back_from_generation"], w["pid"] == 10 ? 1 : 0) << w.dump();

  // The second loss: the budget is spent, the job fails and says so.
  EXPECT_FALSE(state.process_ended(12, "exited with status 1", false));
  EXPECT_EQ(state.state(), JobState::State::kFailed);
  EXPECT_NE(state.failure().find("the restart budget is spent (fault.max_restarts = 1)"),
            std::string::npos) << state.failure();
  EXPECT_EQ(beat_from(state, 0, 2).command(), v1::HeartbeatReply::ABORT);
}

TEST(JobState, ARankDeclaredDeadCountsOnceWhenItsProcessEndsLater) {
  auto o = options(2);
  o.max_restarts = 2;
  std::vector<int> killed;
  o.on_rank_declared_dead = [&killed](int pid) { killed.push_back(pid); };
  JobState state(o);
  auto a = join_async(state, request("h", 0, 10));
  auto b = join_async(state, request("h", 1, 11));
  a.get();
  b.get();
  rank_zero_beats_until_rank_one_is_lost(state);  // rank 1 stays silent
  ASSERT_EQ(state.state(), JobState::State::kWaiting);
  EXPECT_EQ(killed, std::vector<int>{11});
  // The launcher sees the killed process end, and the survivor give up: both
  // replaced, neither counted again.
  EXPECT_TRUE(state.process_ended(11, "was killed by signal 9", false));
  EXPECT_TRUE(state.process_ended(10, "exited with status 1", false));
  v1::StatusReply status;
  state.status(&status);
  EXPECT_EQ(status.restarts(), 1);
}

TEST(JobState, ReplacementForARunningSlotRestartsAtOnceAndBadInputNeverRestarts) {
  auto o = options(2);
  o.max_restarts = 3;
  JobState state(o);
  auto a = join_async(state, request("h", 0, 10));
  auto b = join_async(state, request("h", 1, 11));
  a.get();
  b.get();
  // A supervisor restarted local rank 1 before any heartbeat went missing.
  auto replacement = join_async(state, request("h", 1, 12));
  for (int i = 0; i < 200 && state.state() == JobState::State::kRunning; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(state.state(), JobState::State::kWaiting);
  auto back = request("h", 0, 10);
  back.set_previous_generation(1);
  EXPECT_EQ(beat_from(state, 0, 1).command(), v1::HeartbeatReply::REJOIN);
  auto survivor = join_async(state, back);
  auto [s1, r1] = replacement.get();
  ASSERT_TRUE(s1.ok()) << s1.error_message();
  EXPECT_EQ(r1.generation(), 2);
  EXPECT_EQ(r1.rank(), 1);
  survivor.get();
  EXPECT_NE(state.to_json()["restarts"][0]["reason"].get<std::string>().find("was replaced"),
            std::string::npos);
  // Exit status 2 is bad input: a restart would fail the same way.
  EXPECT_FALSE(state.process_ended(12, "exited with status 2", true));
  EXPECT_EQ(state.state(), JobState::State::kFailed);
  EXPECT_NE(state.failure().find("bad input"), std::string::npos) << state.failure();
}

// Many workers on many hosts: every heartbeat lands on its own rank's row
// (the rank index), and each host's workers are counted and placed.
TEST(JobState, ManyWorkersJoinAndEachHeartbeatFindsItsOwnRank) {
  constexpr int kWorkers = 600;
  JobState state(options(kWorkers, 20000));
  std::vector<std::future<std::pair<grpc::Status, v1::JoinReply>>> joins;
  for (int i = 0; i < kWorkers; ++i) joins.push_back(join_async(state, request("host-" + std::to_string(i % 7), i / 7, 1000 + i)));
  std::vector<v1::JoinReply> replies;
  for (auto& j : joins) {
    auto [status, reply] = j.get();
    ASSERT_TRUE(status.ok()) << status.error_message();
    replies.push_back(reply);
  }
  for (const auto& r : replies) {
    v1::HeartbeatRequest beat;
    beat.set_run_id("run-1");
    beat.set_generation(1);
    beat.set_rank(r.rank());
    beat.set_step(10000 + r.rank());
    v1::HeartbeatReply answer;
    ASSERT_TRUE(state.heartbeat(beat, &answer).ok());
    EXPECT_EQ(answer.command(), v1::HeartbeatReply::CONTINUE);
  }
  v1::StatusReply status;
  state.status(&status);
  ASSERT_EQ(status.ranks_size(), kWorkers);
  for (const auto& row : status.ranks()) EXPECT_EQ(row.step(), 10000 + row.rank()) << row.host();
  for (const auto& r : replies) EXPECT_EQ(r.local_world_size(), r.rank() < 600 % 7 * 86 ? 86 : 85);
}

// A process declared lost that comes back is refused, never merged: its
// heartbeat is answered ABORT naming why, its Join is refused.
TEST(JobState, ARankDeclaredLostThatComesBackIsRefused) {
  auto o = options(2);
  o.max_restarts = 2;
  JobState state(o);
  auto a = join_async(state, request("h", 0, 10));
  auto b = join_async(state, request("h", 1, 11));
  a.get();
  b.get();
  rank_zero_beats_until_rank_one_is_lost(state);  // rank 1 is frozen
  ASSERT_EQ(state.state(), JobState::State::kWaiting);
  EXPECT_EQ(beat_from(state, 0, 1).command(), v1::HeartbeatReply::REJOIN);  // the survivor
  const v1::HeartbeatReply thawed = beat_from(state, 1, 1);
  EXPECT_EQ(thawed.command(), v1::HeartbeatReply::ABORT);
  EXPECT_NE(thawed.reason().find("declared lost"), std::string::npos) << thawed.reason();
  auto back = request("h", 1, 11);
  back.set_previous_generation(1);
  v1::JoinReply reply;
  const auto refused = state.join(back, "p", Clock::now() + std::chrono::seconds(1), &reply);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_NE(refused.error_message().find("not merged"), std::string::npos) << refused.error_message();
}

JobStateOptions elastic_options(int world, int min_ranks, int64_t microbatches) {
  auto o = options(world);
  o.min_ranks = min_ranks;
  o.microbatches = microbatches;
  o.replace_wait = std::chrono::milliseconds(200);
  return o;
}

v1::JoinRequest back_from(const std::string& host, int local_rank, int pid, int64_t generation) {
  auto r = request(host, local_rank, pid);
  r.set_previous_generation(generation);
  return r;
}

// Runs the liveness monitor until `done` or 5 s.
void monitor_until(JobState& state, const std::function<bool()>& done) {
  const auto start = Clock::now();
  while (!done() && Clock::now() - start < std::chrono::seconds(5)) {
    state.check_liveness();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// 4 ranks, 4 microbatches a step, at least 2: a lost rank leaves 3, which
// divide nothing, so 2 go on and the third stands by; a new worker makes
// 4 waiting, and the job grows back (the running ranks told REGROUP).
TEST(JobState, AnElasticJobGoesOnWithFewerRanksAndGrowsBackWhenWorkersJoin) {
  JobState state(elastic_options(4, 2, 4));
  std::vector<std::future<std::pair<grpc::Status, v1::JoinReply>>> first;
  for (int i = 0; i < 4; ++i) first.push_back(join_async(state, request("h" + std::to_string(i), 0, 10 + i)));
  for (auto& j : first) ASSERT_TRUE(j.get().first.ok());
  EXPECT_TRUE(state.process_ended(13, "was killed by signal 9", false));
  ASSERT_EQ(state.state(), JobState::State::kWaiting);
  std::vector<std::future<std::pair<grpc::Status, v1::JoinReply>>> survivors;
  for (int i = 0; i < 3; ++i) survivors.push_back(join_async(state, back_from("h" + std::to_string(i), 0, 10 + i, 1)));
  monitor_until(state, [&] { return state.state() == JobState::State::kRunning; });
  ASSERT_EQ(state.state(), JobState::State::kRunning);
  int running = 0, standing_by = 0, standby = -1;
  for (size_t i = 0; i < survivors.size(); ++i) {
    auto [status, reply] = survivors[i].get();
    if (status.ok()) {
      ++running;
      EXPECT_EQ(reply.world_size(), 2);
      EXPECT_EQ(reply.generation(), 2);
      EXPECT_TRUE(reply.resume());
    } else {
      ++standing_by;
      standby = int(i);  // which survivor waits depends on the order they rejoined
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
      EXPECT_EQ(status.error_message().rfind("standby:", 0), 0u) << status.error_message();
    }
  }
  EXPECT_EQ(running, 2);
  EXPECT_EQ(standing_by, 1);
  auto json = state.to_json();
  ASSERT_EQ(json["membership"].size(), 1u) << json.dump();
  EXPECT_EQ(json["membership"][0]["world_size_before"], 4);
  EXPECT_EQ(json["membership"][0]["world_size"], 2);
  EXPECT_EQ(json["membership"][0]["kind"], "loss");
  v1::StatusReply status;
  state.status(&status);
  EXPECT_EQ(status.world_size(), 2);

  // The standby asks again: 3 would divide nothing, so it waits on.
  v1::JoinReply reply;
  ASSERT_GE(standby, 0);
  auto again = state.join(back_from("h" + std::to_string(standby), 0, 10 + standby, 1), "p",
                          Clock::now() + std::chrono::seconds(1), &reply);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::UNAVAILABLE) << again.error_message();
  EXPECT_NE(again.error_message().find("1 more worker"), std::string::npos) << again.error_message();
  // A new worker on the lost host's place: 4 wait, the job regroups to 4.
  auto newcomer = join_async(state, request("h3", 0, 20));
  for (int i = 0; i < 100 && state.state() == JobState::State::kRunning; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(state.state(), JobState::State::kWaiting);
  EXPECT_EQ(beat_from(state, 0, 2).command(), v1::HeartbeatReply::REGROUP);
  std::vector<std::future<std::pair<grpc::Status, v1::JoinReply>>> third;
  for (int i = 0; i < 3; ++i) third.push_back(join_async(state, back_from("h" + std::to_string(i), 0, 10 + i, 2)));
  auto [joined, placed] = newcomer.get();
  ASSERT_TRUE(joined.ok()) << joined.error_message();
  EXPECT_EQ(placed.world_size(), 4);
  EXPECT_EQ(placed.generation(), 3);
  for (auto& j : third) EXPECT_TRUE(j.get().first.ok());
  json = state.to_json();
  ASSERT_EQ(json["membership"].size(), 2u);
  EXPECT_EQ(json["membership"][1]["world_size"], 4);
  EXPECT_EQ(json["membership"][1]["kind"], "regroup");
}

TEST(JobState, AnElasticJobBelowItsMinimumFailsNamingTheRange) {
  JobState state(elastic_options(4, 3, 12));
  std::vector<std::future<std::pair<grpc::Status, v1::JoinReply>>> first;
  for (int i = 0; i < 4; ++i) first.push_back(join_async(state, request("h" + std::to_string(i), 0, 10 + i)));
  for (auto& j : first) ASSERT_TRUE(j.get().first.ok());
  EXPECT_TRUE(state.process_ended(13, "was killed by signal 9", false));
  EXPECT_TRUE(state.process_ended(12, "was killed by signal 9", false));  // the same generation's end
  auto a = join_async(state, back_from("h0", 0, 10, 1));
  auto b = join_async(state, back_from("h1", 0, 11, 1));
  monitor_until(state, [&] { return state.state() != JobState::State::kWaiting; });
  ASSERT_EQ(state.state(), JobState::State::kFailed);
  EXPECT_NE(state.failure().find("elastic.min_ranks = 3"), std::string::npos) << state.failure();
  a.get();
  b.get();
}

TEST(JobState, AHostLostAsOftenAsAllowedIsKeptOut) {
  auto o = elastic_options(2, 1, 2);
  o.max_host_losses = 1;
  JobState state(o);
  auto a = join_async(state, request("steady", 0, 10));
  auto b = join_async(state, request("flaky", 0, 11));
  a.get();
  b.get();
  EXPECT_TRUE(state.process_ended(11, "was killed by signal 9", false));
  v1::JoinReply reply;
  auto refused = state.join(request("flaky", 0, 12), "p", Clock::now() + std::chrono::seconds(1), &reply);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_NE(refused.error_message().find("elastic.max_host_losses = 1"), std::string::npos) << refused.error_message();
}

}  // namespace
}  // namespace lockstep

// Benchmark: membership at scale. A real `lockstep coordinator` process
// (its own process, so that its CPU time is its own) and N simulated
// workers in this one, over the real gRPC API on loopback: every worker
// calls Join (all held until the last one joins, as in a real rendezvous),
// then sends a Heartbeat once a second, spread evenly over the second, for
// `seconds` seconds. Reported per N: the time for all to join, the
// coordinator's CPU during the joins and per second of heartbeats (in
// cores), heartbeat latency p50/p99/max, and false deaths: heartbeats
// answered with anything but CONTINUE, failed calls, and ranks the
// coordinator's Status lists as not running at the end.
// Prints JSON on stdout.
// Usage: coordinator_scale [workers=1000,4000,10000] [seconds=60] [workers per connection=1]
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "bench/bench_figures.h"
#include "lockstep/proto/lockstep.grpc.pb.h"

using namespace lockstep;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

extern char** environ;

namespace {

const std::string kToken = "scale-bench-token-0123456789abcdef";

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// CPU seconds (user + system) a process has used so far.
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i)
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  return ticks / double(::sysconf(_SC_CLK_TCK));
}

struct Coordinator {
  pid_t pid = 0;
  std::string address, log;
};

// The lockstep binary under test: this build's, or LOCKSTEP_SCALE_EXE (to
// set another build's coordinator beside it).
std::string lockstep_exe() {
  const char* other = std::getenv("LOCKSTEP_SCALE_EXE");
  return other && *other ? other : LOCKSTEP_EXE;
}

Coordinator start_coordinator(int workers, const std::string& folder) {
  Coordinator c;
  const std::string exe = lockstep_exe();
  c.log = folder + "/coordinator.log";
  const std::vector<std::string> args = {
      exe, "coordinator", std::string(LOCKSTEP_SOURCE_DIR) + "/examples/synthetic.toml",
      "--listen", "127.0.0.1:0",
      "--set", "job.world_size=" + std::to_string(workers),
      "--set", "data.global_batch=" + std::to_string(workers), "--set", "data.microbatch=1",
      "--set", "data.synthetic_samples=" + std::to_string(2 * workers),
      "--set", "job.run_dir=" + folder + "/runs", "--set", "fault.heartbeat_s=1",
      "--set", "fault.heartbeat_timeout_s=10", "--set", "comm.rendezvous_timeout_s=600"};
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_text = {"LOCKSTEP_TOKEN=" + kToken};
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("LOCKSTEP_TOKEN=", 0) != 0) env_text.push_back(*e);
  std::vector<char*> env;
  for (auto& e : env_text) env.push_back(e.data());
  env.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, c.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&files, 1, 2);
  if (posix_spawn(&c.pid, exe.c_str(), &files, nullptr, argv.data(), env.data()) != 0)
    throw std::runtime_error("cannot start " + exe);
  posix_spawn_file_actions_destroy(&files);
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < give_up) {
    std::ifstream in(c.log);
    for (std::string line; std::getline(in, line);) {
      const auto at = line.find("listening on ");
      if (at == std::string::npos) continue;
      c.address = line.substr(at + 13, line.find(' ', at + 13) - at - 13);
      return c;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(c.pid, SIGKILL);
  throw std::runtime_error("the coordinator did not listen within 60 s; its log: " + c.log);
}

struct Call {
  grpc::ClientContext context;
  grpc::Status status;
  v1::JoinReply join;
  v1::HeartbeatReply beat;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::JoinReply>> join_reader;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::HeartbeatReply>> beat_reader;
  Clock::time_point sent;
  int worker = 0;
  bool is_join = false;
};

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return -1;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, size_t(p * double(values.size())))];
}

json measure(int workers, int seconds, int workers_per_connection) {
  const std::string folder = std::filesystem::temp_directory_path() / ("lockstep-scale-" + std::to_string(::getpid()));
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  Coordinator coordinator = start_coordinator(workers, folder);

  // A connection per worker, as real workers have (each its own channel).
  const int connections = std::max(1, workers / workers_per_connection);
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs;
  for (int c = 0; c < connections; ++c) {
    grpc::ChannelArguments arguments;
    arguments.SetInt("lockstep.bench.connection", c);  // a channel (and connection) of its own
    stubs.push_back(v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(coordinator.address, grpc::InsecureChannelCredentials(), arguments)));
  }
  grpc::CompletionQueue queue;
  std::vector<v1::JoinReply> placed{size_t(workers)};
  std::vector<double> join_done(size_t(workers), -1), latencies;
  std::mutex latencies_mutex;
  std::atomic<int> joined{0}, join_failures{0}, beats_answered{0}, beats_failed{0}, not_continue{0};
  std::atomic<bool> draining{false};
  std::string first_error;

  std::thread poller([&] {
    void* tag = nullptr;
    bool ok = false;
    while (queue.Next(&tag, &ok)) {
      std::unique_ptr<Call> call(static_cast<Call*>(tag));
      const double latency = seconds_since(call->sent);
      if (call->is_join) {
        if (ok && call->status.ok()) {
          placed[size_t(call->worker)] = call->join;
          ++joined;
        } else {
          if (join_failures++ == 0) first_error = call->status.error_message();
        }
        join_done[size_t(call->worker)] = latency;
      } else if (ok && call->status.ok()) {
        ++beats_answered;
        if (call->beat.command() != v1::HeartbeatReply::CONTINUE) ++not_continue;
        std::lock_guard<std::mutex> lock(latencies_mutex);
        latencies.push_back(latency * 1000.0);
      } else {
        ++beats_failed;
      }
    }
  });

  const double cpu_before_joins = cpu_seconds(coordinator.pid);
  const auto joins_start = Clock::now();
  for (int i = 0; i < workers; ++i) {
    auto* call = new Call;
    call->is_join = true;
    call->worker = i;
    call->context.AddMetadata("lockstep-token", kToken);
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
    v1::JoinRequest request;
    request.set_api_version("lockstep.v1");
    request.set_hostname("sim-host-" + std::to_string(i / 8));
    request.set_local_rank(i % 8);
    request.set_pid(100000 + i);
    call->sent = Clock::now();
    call->join_reader = stubs[size_t(i % connections)]->PrepareAsyncJoin(&call->context, request, &queue);
    call->join_reader->StartCall();
    call->join_reader->Finish(&call->join, &call->status, call);
  }
  while (joined + join_failures < workers && seconds_since(joins_start) < 300)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const double join_s = seconds_since(joins_start);
  const double join_cpu_s = cpu_seconds(coordinator.pid) - cpu_before_joins;

  // Heartbeats: worker i at i/N of every second, for `seconds` seconds.
  const double cpu_before_beats = cpu_seconds(coordinator.pid);
  const auto beats_start = Clock::now();
  int64_t sent = 0;
  if (join_failures == 0) {
    for (int second = 0; second < seconds; ++second)
      for (int i = 0; i < workers; ++i) {
        const auto due = beats_start + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(second + double(i) / workers));
        if (Clock::now() < due) std::this_thread::sleep_until(due);
        auto* call = new Call;
        call->worker = i;
        call->context.AddMetadata("lockstep-token", kToken);
        call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        v1::HeartbeatRequest request;
        request.set_run_id(placed[size_t(i)].run_id());
        request.set_rank(placed[size_t(i)].rank());
        request.set_generation(placed[size_t(i)].generation());
        request.set_step(second);
        request.set_phase("train");
        call->sent = Clock::now();
        call->beat_reader = stubs[size_t(i % connections)]->PrepareAsyncHeartbeat(&call->context, request, &queue);
        call->beat_reader->StartCall();
        call->beat_reader->Finish(&call->beat, &call->status, call);
        ++sent;
      }
  }
  const double beats_s = seconds_since(beats_start);
  while (beats_answered + beats_failed < sent && seconds_since(beats_start) < seconds + 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double beat_cpu_s = cpu_seconds(coordinator.pid) - cpu_before_beats;

  // The coordinator's own view: every rank still running, none dead.
  int not_running = -1;
  std::string job_state;
  {
    grpc::ClientContext context;
    context.AddMetadata("lockstep-token", kToken);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::StatusReply status;
    if (stubs[0]->Status(&context, v1::StatusRequest(), &status).ok()) {
      job_state = status.state();
      not_running = 0;
      for (const auto& r : status.ranks()) not_running += r.state() != "running";
    }
  }
  ::kill(coordinator.pid, SIGTERM);
  int ignored = 0;
  ::waitpid(coordinator.pid, &ignored, 0);
  queue.Shutdown();
  poller.join();
  std::filesystem::remove_all(folder);

  std::vector<double> joins(join_done.begin(), join_done.end());
  return {{"workers", workers},
          {"connections", connections},
          {"join_all_s", join_s},
          {"joined", joined.load()},
          {"join_failures", join_failures.load()},
          {"first_join_error", first_error},
          {"join_cpu_cores", join_s > 0 ? join_cpu_s / join_s : 0},
          {"heartbeat_seconds", beats_s},
          {"heartbeats_sent", sent},
          {"heartbeats_answered", beats_answered.load()},
          {"heartbeats_failed", beats_failed.load()},
          {"coordinator_cpu_cores_during_heartbeats", beats_s > 0 ? beat_cpu_s / beats_s : 0},
          {"heartbeat_ms", {{"p50", percentile(latencies, 0.5)}, {"p99", percentile(latencies, 0.99)},
                            {"max", percentile(latencies, 1.0)}}},
          {"false_deaths", {{"replies_not_continue", not_continue.load()},
                            {"ranks_not_running_at_end", not_running},
                            {"job_state_at_end", job_state}}}};
}

}  // namespace

int main(int argc, char** argv) {
  // As in the coordinator: no lock-order checking in gRPC's locks, so that
  // ten thousand simulated workers leave the coordinator its share of the cores.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::vector<int> sizes = {1000, 4000, 10000};
  if (argc > 1) {
    sizes.clear();
    std::stringstream list(argv[1]);
    for (std::string item; std::getline(list, item, ',');) sizes.push_back(std::stoi(item));
  }
  const int seconds = argc > 2 ? std::stoi(argv[2]) : 60;
  const int workers_per_connection = argc > 3 ? std::max(1, std::stoi(argv[3])) : 1;
  json results = json::array();
  for (int workers : sizes) {
    results.push_back(measure(workers, seconds, workers_per_connection));
    std::fprintf(stderr, "%s\n", results.back().dump().c_str());
  }
  json out = {{"benchmark", "coordinator_scale"},
              {"setup", {{"cpu", lockstep::bench::cpu_model()},
                         {"lockstep", lockstep_exe()},
                         {"cores", std::thread::hardware_concurrency()},
                         {"coordinator", "lockstep coordinator (its own process), examples/synthetic.toml, "
                                         "fault.heartbeat_s = 1, fault.heartbeat_timeout_s = 10"},
                         {"clients", "simulated workers in one process: async gRPC over loopback, a "
                                     "connection (channel) per worker unless told otherwise; Join, then "
                                     "one Heartbeat a second each, spread evenly"},
                         {"heartbeat_seconds", seconds},
                         {"workers_per_connection", workers_per_connection}}},
              {"results", results}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

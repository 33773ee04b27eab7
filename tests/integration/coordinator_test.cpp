// The coordinator end to end with real gRPC on loopback and real processes:
// the embedded one behind `lockstep run`, one started by hand with workers
// started by hand, TLS, and a rendezvous that never fills.
#include <chrono>
#include <csignal>
#include <filesystem>
#include <regex>
#include <thread>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "integration/cluster.h"

namespace lockstep::testing {
namespace {

TEST(Coordinator, RunTrainsThroughTheEmbeddedCoordinatorAndStatusShowsProgress) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir dir;
  LockstepProcess run({"run", examples_dir() + "/fashion_mnist_mlp.toml", "--nproc", "2", "--set",
                       "job.run_dir=" + dir.path() + "/runs", "--set", "job.epochs=0", "--set",
                       "job.steps=3000", "--set", "fault.heartbeat_s=0.2"},
                      dir.path(), {"LOCKSTEP_TOKEN=" + kToken});
  ASSERT_TRUE(run.wait_for_output("listening on", 30)) << run.output();
  std::smatch match;
  std::string out = run.output();
  ASSERT_TRUE(std::regex_search(out, match, std::regex("listening on [^:]+:([0-9]+)")));
  const std::string address = "127.0.0.1:" + match[1].str();

  // `lockstep status --json`, the command a person would run, twice.
  auto steps = [&]() {
    auto result = run_lockstep({"status", "--coordinator", address, "--json"}, dir.path(), 15,
                               {"LOCKSTEP_TOKEN=" + kToken});
    EXPECT_EQ(result.exit_code, 0) << result.output;
    auto json = nlohmann::json::parse(result.output.substr(result.output.find('{')));
    std::vector<int64_t> out;
    // Counts are JSON numbers (docs/commands.md: `lockstep status --json`).
    EXPECT_TRUE(json["generation"].is_number_integer()) << json.dump();
    for (const auto& r : json["ranks"]) {
      EXPECT_TRUE(r["pid"].is_number_integer()) << r.dump();
      out.push_back(r["step"].get<int64_t>());
    }
    return std::make_pair(json, out);
  };
  std::vector<int64_t> first;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    first = steps().second;
    if (first.size() == 2 && first[0] > 0 && first[1] > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_EQ(first.size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto [json, second] = steps();
  ASSERT_EQ(second.size(), 2u) << json.dump();
  EXPECT_GT(second[0], first[0]);
  EXPECT_GT(second[1], first[1]);
  EXPECT_EQ(json["state"], "running");

  auto table = run_lockstep({"status", "--coordinator", address}, dir.path(), 15,
                            {"LOCKSTEP_TOKEN=" + kToken});
  EXPECT_NE(table.output.find("samples/s"), std::string::npos) << table.output;

  EXPECT_EQ(run.wait(120), 0) << run.output();
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "completed");
  EXPECT_EQ(manifest["coordinator"]["state"], "completed");
  EXPECT_EQ(manifest["coordinator"]["workers"].size(), 2u);
}

TEST(Coordinator, HandStartedCoordinatorAndWorkersTrainToTheEnd) {
  TempDir dir;
  Cluster cluster(dir, {"job.steps=30"});
  auto& a = cluster.add_worker();
  auto& b = cluster.add_worker();
  EXPECT_EQ(a.wait(120), 0) << a.output();
  EXPECT_EQ(b.wait(120), 0) << b.output();
  EXPECT_EQ(cluster.coordinator->wait(30), 0) << cluster.coordinator->output();
  EXPECT_NE(cluster.coordinator->output().find("Decision: ranks = rank 0 = "), std::string::npos);
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "completed");
  EXPECT_EQ(manifest["metrics"]["steps"], 30);
  const auto& workers = manifest["coordinator"]["workers"];
  ASSERT_EQ(workers.size(), 2u);
  std::set<int> pids = {workers[0]["pid"].get<int>(), workers[1]["pid"].get<int>()};
  EXPECT_EQ(pids, (std::set<int>{a.pid(), b.pid()}));
  for (const auto& w : workers) {
    EXPECT_FALSE(w["joined_at"].get<std::string>().empty());
    EXPECT_NE(w["peer"].get<std::string>().find("127.0.0.1"), std::string::npos);
    EXPECT_EQ(w["state"], "finished");
    EXPECT_GT(w["heartbeats"].get<int>(), 0);
  }
}

TEST(Coordinator, TlsWorksWithTheCaAndRefusesAClientWithoutIt) {
  TempDir dir;
  const std::string cert = dir.path() + "/cert.pem", key = dir.path() + "/key.pem";
  std::string command = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
                        "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " + key +
                        " -out " + cert + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << "openssl could not make a certificate";
  Cluster cluster(dir, {"job.steps=20"}, {"--tls-cert", cert, "--tls-key", key});
  auto refused = run_lockstep({"status", "--coordinator", cluster.address("localhost")}, dir.path(),
                              20, {"LOCKSTEP_TOKEN=" + kToken});
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("UNAVAILABLE"), std::string::npos) << refused.output;
  auto& a = cluster.add_worker({"--tls-ca", cert}, "localhost");
  auto& b = cluster.add_worker({"--tls-ca", cert}, "localhost");
  EXPECT_EQ(a.wait(120), 0) << a.output();
  EXPECT_EQ(b.wait(120), 0) << b.output();
  EXPECT_EQ(cluster.coordinator->wait(30), 0) << cluster.coordinator->output();
  EXPECT_NE(cluster.coordinator->output().find("(TLS)"), std::string::npos);
}

TEST(Coordinator, RendezvousTimeoutNamesWhoJoined) {
  TempDir dir;
  Cluster cluster(dir, {"comm.rendezvous_timeout_s=3"});
  auto& lonely = cluster.add_worker();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(cluster.coordinator->wait(20), 1) << cluster.coordinator->output();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 8.0);
  const std::string expected = "1 of 2 joined: ";
  EXPECT_NE(cluster.coordinator->output().find("rendezvous timed out after 3"), std::string::npos)
      << cluster.coordinator->output();
  EXPECT_NE(cluster.coordinator->output().find(expected), std::string::npos);
  EXPECT_NE(cluster.coordinator->output().find("pid " + std::to_string(lonely.pid())),
            std::string::npos);
  EXPECT_NE(lonely.wait(20), 0);
  EXPECT_NE(lonely.output().find("rendezvous timed out"), std::string::npos) << lonely.output();
}

}  // namespace
}  // namespace lockstep::testing

namespace lockstep::testing {
namespace {

// Seconds since midnight from a log line's "HH:MM:SS.mmm" before `marker`; -1 if absent.
double logged_time(const std::string& output, const std::string& marker) {
  const size_t at = output.find(marker);
  if (at == std::string::npos) return -1;
  const size_t line = output.rfind('\n', at) == std::string::npos ? 0 : output.rfind('\n', at) + 1;
  std::smatch match;
  const std::string text = output.substr(line, at - line);
  if (!std::regex_search(text, match, std::regex("([0-9]{2}):([0-9]{2}):([0-9]{2}\\.[0-9]{3})"))) return -1;
  return std::stoi(match[1]) * 3600.0 + std::stoi(match[2]) * 60.0 + std::stod(match[3]);
}

TEST(Coordinator, AWorkerStartedFirstJoinsWithinASecondOfTheCoordinator) {
  TempDir dir;
  const int port = free_port();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  // The worker knocks for 6 s first: long enough for any backoff to grow.
  LockstepProcess worker({"worker", "--coordinator", address, "--rendezvous-timeout", "60"}, dir.path(),
                         {"LOCKSTEP_TOKEN=" + kToken});
  ASSERT_TRUE(worker.wait_for_output("waiting for the coordinator", 30)) << worker.output();
  std::this_thread::sleep_for(std::chrono::seconds(6));
  LockstepProcess coordinator({"coordinator", examples_dir() + "/synthetic.toml", "--listen", address, "--set",
                               "job.run_dir=" + dir.path() + "/runs", "--set", "job.world_size=1", "--set",
                               "job.steps=2"},
                              dir.path(), {"LOCKSTEP_TOKEN=" + kToken});
  ASSERT_TRUE(coordinator.wait_for_output("join 1 of 1", 30)) << coordinator.output();
  const double listening = logged_time(coordinator.output(), "coordinator: listening on");
  const double joined = logged_time(coordinator.output(), "coordinator: join 1 of 1");
  ASSERT_GE(listening, 0) << coordinator.output();
  EXPECT_LT(joined - listening, 1.0) << coordinator.output();
  std::printf("a worker that started 6 s early joined %.3f s after the coordinator listened\n", joined - listening);
  EXPECT_EQ(coordinator.wait(60), 0) << coordinator.output();
  EXPECT_EQ(worker.wait(30), 0) << worker.output();
}

// One grpc.health.v1.Health/Check call, as a readiness probe makes it: the
// request is the empty HealthCheckRequest (service ""), the reply's bytes
// are returned (08 01: status SERVING). No token.
std::string health_check(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::CompletionQueue queue;
  grpc::ByteBuffer request, reply;
  grpc::Slice empty("", 0);
  request = grpc::ByteBuffer(&empty, 1);
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &queue);
  call->StartCall();
  grpc::Status status;
  call->Finish(&reply, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  if (!queue.Next(&tag, &ok) || !ok || !status.ok()) return "error: " + status.error_message();
  std::vector<grpc::Slice> slices;
  (void)reply.Dump(&slices);
  std::string bytes;
  for (const auto& slice : slices) bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return bytes;
}

TEST(Coordinator, AnswersTheStandardGrpcHealthCheckWithoutAToken) {
  TempDir dir;
  Cluster cluster(dir, {"job.steps=2"});
  EXPECT_EQ(health_check(cluster.address()), std::string("\x08\x01", 2)) << "SERVING";
  EXPECT_NE(health_check("127.0.0.1:" + std::to_string(free_port())).rfind("error", 0), std::string::npos);
  cluster.coordinator->signal(SIGTERM);
  EXPECT_EQ(cluster.coordinator->wait(30), 1);
}

}  // namespace
}  // namespace lockstep::testing

// The coordinator's Prometheus endpoint, scraped over a real socket while
// two real workers train: the documented series, and values that match
// what `lockstep status` says at the same time. Half the targets are
// missing and a rank's batch is one sample, so about a quarter of the
// global batches hold no valid target: skipped steps to count.
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include "integration/cluster.h"
#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

std::string http_get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  char buffer[4096];
  for (ssize_t got; (got = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) response.append(buffer, size_t(got));
  ::close(fd);
  return response;
}

// The value of the series line that starts with `prefix` ("lockstep_rank_step{...rank=\"1\"").
double value_of(const std::string& text, const std::string& prefix) {
  const size_t at = text.find("\n" + prefix);
  if (at == std::string::npos) return -1e300;
  const size_t line_end = text.find('\n', at + 1);
  const std::string line = text.substr(at + 1, line_end - at - 1);
  return std::stod(line.substr(line.rfind(' ') + 1));
}

TEST(Metrics, AScrapeDuringARunHasTheSeriesAndMatchesStatus) {
  TempDir dir;
  Cluster cluster(dir, {"job.steps=200000", "audit.every=50", "fault.heartbeat_s=0.1", "data.missing_targets=0.5",
                        "data.batch_size=1"},
                  {"--metrics", "127.0.0.1:0"});
  ASSERT_TRUE(cluster.coordinator->wait_for_output("/metrics (Prometheus", 30)) << cluster.coordinator->output();
  std::smatch match;
  const std::string out = cluster.coordinator->output();
  ASSERT_TRUE(std::regex_search(out, match, std::regex("metrics on http://127.0.0.1:([0-9]+)/metrics"))) << out;
  const int port = std::stoi(match[1]);
  cluster.add_worker();
  cluster.add_worker();
  ASSERT_TRUE(cluster.wait_for_steps(120, 60)) << cluster.coordinator->output();
  const v1::StatusReply before = cluster.status();
  const std::string scrape = http_get(port, "/metrics");
  const v1::StatusReply after = cluster.status();
  ASSERT_NE(scrape.find("HTTP/1.1 200 OK"), std::string::npos) << scrape;
  EXPECT_NE(scrape.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << scrape;
  const std::string run = "{run=\"" + after.run_id() + "\"";
  EXPECT_NE(scrape.find("lockstep_up{run=\"" + after.run_id() + "\",state=\"running\"} 1"), std::string::npos) << scrape;
  EXPECT_EQ(value_of(scrape, "lockstep_world_size" + run), 2);
  EXPECT_EQ(value_of(scrape, "lockstep_joined_workers" + run), after.joined());
  EXPECT_EQ(value_of(scrape, "lockstep_generation" + run), double(after.generation()));
  EXPECT_EQ(value_of(scrape, "lockstep_restarts_total" + run), after.restarts());
  EXPECT_EQ(value_of(scrape, "lockstep_first_drift_step" + run), -1);
  EXPECT_EQ(value_of(scrape, "lockstep_audit_disagreements_total" + run), 0);
  const double audits = value_of(scrape, "lockstep_audits_total" + run);
  EXPECT_GE(audits, double(before.audits()));
  EXPECT_LE(audits, double(after.audits()));
  EXPECT_GE(audits, 2) << "audits at step 1 and every 50";
  const double skipped = value_of(scrape, "lockstep_skipped_steps_total" + run);
  EXPECT_GE(skipped, double(before.skipped_steps()));
  EXPECT_LE(skipped, double(after.skipped_steps()));
  EXPECT_GT(after.skipped_steps(), 5) << "about a quarter of 120 steps or more";
  for (const auto& rank : after.ranks()) {
    const std::string labels = "{run=\"" + after.run_id() + "\",rank=\"" + std::to_string(rank.rank()) + "\"";
    const double step = value_of(scrape, "lockstep_rank_step" + labels);
    EXPECT_GE(step, double(before.ranks(rank.rank()).step())) << "rank " << rank.rank();
    EXPECT_LE(step, double(rank.step())) << "rank " << rank.rank();
    EXPECT_GT(value_of(scrape, "lockstep_rank_loss" + labels), 0) << scrape;
    EXPECT_GT(value_of(scrape, "lockstep_rank_samples_per_second" + labels), 0) << scrape;
    const double age = value_of(scrape, "lockstep_rank_heartbeat_age_seconds" + labels);
    EXPECT_GE(age, 0);
    EXPECT_LT(age, 5) << scrape;
    EXPECT_LE(rank.skipped_steps(), after.skipped_steps());
    EXPECT_GE(rank.skipped_steps(), before.skipped_steps() - 5) << "every rank skips the same steps";
  }
  for (const char* documented : {"# TYPE lockstep_restarts_total counter", "# TYPE lockstep_rank_loss gauge",
                                 "# HELP lockstep_audit_disagreements_total", "# TYPE lockstep_skipped_steps_total counter"})
    EXPECT_NE(scrape.find(documented), std::string::npos) << documented;
  EXPECT_NE(http_get(port, "/").find("404 Not Found"), std::string::npos);
  cluster.coordinator->signal(SIGINT);
  EXPECT_EQ(cluster.coordinator->wait(30), 1) << cluster.coordinator->output();
}

// A connection that sends its request one byte every `gap_ms` and never
// finishes: what a slow or hostile client does to a one-at-a-time server.
class TricklingClient {
 public:
  TricklingClient(int port, int gap_ms) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(uint16_t(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return;
    thread_ = std::thread([this, gap_ms] {
      const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Padding: " + std::string(200, 'a');
      for (size_t i = 0; i < request.size() && !stop_; ++i) {
        if (::send(fd_, &request[i], 1, MSG_NOSIGNAL) != 1) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
      }
    });
  }
  ~TricklingClient() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    ::close(fd_);
  }

 private:
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(Metrics, SlowClientsDelayNoOtherScrape) {
  TempDir dir;
  Cluster cluster(dir, {"job.steps=200000"}, {"--metrics", "127.0.0.1:0"});
  ASSERT_TRUE(cluster.coordinator->wait_for_output("/metrics (Prometheus", 30)) << cluster.coordinator->output();
  std::smatch match;
  const std::string out = cluster.coordinator->output();
  ASSERT_TRUE(std::regex_search(out, match, std::regex("metrics on http://127.0.0.1:([0-9]+)/metrics"))) << out;
  const int port = std::stoi(match[1]);
  std::vector<std::unique_ptr<TricklingClient>> slow;
  for (int i = 0; i < 8; ++i) slow.push_back(std::make_unique<TricklingClient>(port, 300));
  // While eight connections trickle, each scrape is answered at once.
  for (int i = 0; i < 6; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const std::string scrape = http_get(port, "/metrics");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(scrape.find("HTTP/1.1 200 OK"), std::string::npos) << "scrape " << i;
    EXPECT_LT(seconds, 0.5) << "scrape " << i << " waited behind the slow clients";
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  slow.clear();
  cluster.coordinator->signal(SIGINT);
  EXPECT_EQ(cluster.coordinator->wait(30), 1) << cluster.coordinator->output();
}

TEST(Metrics, AnAddressThatCannotServeIsBadInputBeforeAnyRunFolder) {
  TempDir dir;
  const std::string runs = dir.path() + "/runs";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:70000"}, "port '70000' is not a number from 0 to 65535"},
      {{"--listen", "127.0.0.1:0", "--metrics", ":70000"}, "port '70000' is not a number from 0 to 65535"},
      {{"--listen", "10.255.255.1:0"}, "--listen '10.255.255.1:0': cannot listen on host '10.255.255.1'"},
      {{"--listen", "127.0.0.1:0", "--metrics", "10.255.255.1:0"}, "--metrics '10.255.255.1:0': cannot listen"},
  };
  for (const auto& [flags, needle] : cases) {
    std::vector<std::string> args = {"coordinator", examples_dir() + "/synthetic.toml", "--set", "job.run_dir=" + runs};
    args.insert(args.end(), flags.begin(), flags.end());
    const auto result = run_lockstep(args, dir.path(), 30, {"LOCKSTEP_TOKEN=" + kToken});
    EXPECT_EQ(result.exit_code, 2) << needle << "\n" << result.output;
    EXPECT_NE(result.output.find(needle), std::string::npos) << result.output;
    EXPECT_FALSE(std::filesystem::exists(runs)) << needle << ": a run folder was left";
  }
  const auto run = run_lockstep(synthetic_run(dir, 2, {"job.steps=2"}), dir.path(), 60);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::vector<std::string> args = synthetic_run(dir, 2, {"job.steps=2"});
  args.push_back("--metrics");
  args.push_back("127.0.0.1:99999");
  const auto bad = run_lockstep(args, dir.path(), 30);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("port '99999' is not a number from 0 to 65535"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace lockstep::testing

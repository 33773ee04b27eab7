#pragma once
// A coordinator and workers as separate real processes on loopback, the way
// they would run on separate machines.
#include <chrono>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "integration/jobs.h"
#include "worker/coordinator_client.h"

namespace lockstep::testing {

inline const std::string kToken = "test-token-0123456789abcdef";

class Cluster {
 public:
  // Starts `lockstep coordinator examples/synthetic.toml --listen 127.0.0.1:0`
  // with `sets`, a run folder in `dir`, and waits until it listens.
  Cluster(const TempDir& dir, const std::vector<std::string>& sets,
          const std::vector<std::string>& extra_args = {}) : dir_(dir) {
    std::vector<std::string> args = {"coordinator", examples_dir() + "/synthetic.toml", "--listen",
                                     "127.0.0.1:0", "--set", "job.run_dir=" + dir.path() + "/runs"};
    for (const auto& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    coordinator = std::make_unique<LockstepProcess>(args, dir.path(),
                                                    std::vector<std::string>{"LOCKSTEP_TOKEN=" + kToken});
    EXPECT_TRUE(coordinator->wait_for_output("listening on", 30)) << coordinator->output();
    std::smatch match;
    const std::string& out = coordinator->output();
    if (std::regex_search(out, match, std::regex("listening on [^:]+:([0-9]+)")))
      port = std::stoi(match[1]);
    EXPECT_GT(port, 0) << out;
  }

  std::string address(const std::string& host = "127.0.0.1") const {
    return host + ":" + std::to_string(port);
  }

  // Starts a worker that joins this coordinator.
  LockstepProcess& add_worker(const std::vector<std::string>& extra_args = {},
                              const std::string& host = "127.0.0.1") {
    std::vector<std::string> args = {"worker", "--coordinator", address(host)};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    workers.push_back(std::make_unique<LockstepProcess>(
        args, dir_.path(), std::vector<std::string>{"LOCKSTEP_TOKEN=" + kToken}));
    return *workers.back();
  }

  CoordinatorClient client(const std::string& token = kToken) const {
    return CoordinatorClient({address(), token, ""});
  }

  // The status, or a failed test.
  v1::StatusReply status() const {
    v1::StatusReply reply;
    auto s = client().status(&reply, std::chrono::seconds(5));
    EXPECT_TRUE(s.ok()) << describe(s);
    return reply;
  }

  // Polls until every rank reports at least `step` steps; false at the timeout.
  bool wait_for_steps(int64_t step, double timeout_s) const {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      auto reply = status();
      bool all = reply.ranks_size() > 0;
      for (const auto& r : reply.ranks()) all &= r.step() >= step;
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  int64_t min_step() const {
    int64_t least = INT64_MAX;
    const v1::StatusReply reply = status();
    for (const auto& r : reply.ranks()) least = std::min<int64_t>(least, r.step());
    return least;
  }

  std::unique_ptr<LockstepProcess> coordinator;
  std::vector<std::unique_ptr<LockstepProcess>> workers;
  int port = 0;

 private:
  const TempDir& dir_;
};

}  // namespace lockstep::testing

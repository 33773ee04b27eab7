// Benchmark: step time across hosts. The cnn and the mlp on Fashion-MNIST,
// 2 ranks, one thread each: on one host over loopback (`lockstep run`),
// and with the coordinator and each rank on a namespace host of its own
// (support/net_hosts.h) over their veth links, uncapped and capped both
// ways with `tc tbf` to 1 Gbit/s and 100 Mbit/s. At 100 Mbit/s the cnn also
// runs with comm.bucket_mb = 25 against the example's 1: does the bucket
// size want choosing from the link? Configurations interleave within each
// repetition; each figure is the run's own median step time (after 10
// warm-up steps), and ratios are taken within a repetition. Needs root.
// Prints JSON on stdout and a table on stderr.
// Usage: multihost_links [repetitions=3] [steps=60]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench/bench_figures.h"
#include "support/cli_runner.h"
#include "support/net_hosts.h"

using namespace lockstep::testing;
using nlohmann::json;
using lockstep::bench::cpu_model;
using lockstep::bench::summary;
namespace fs = std::filesystem;

namespace {

const std::string kToken = "bench-token-0123456789abcdef0123";

struct Config {
  std::string model;   // cnn | mlp
  std::string link;    // loopback | veth | 1gbit | 100mbit
  double bucket_mb;    // comm.bucket_mb
  std::string name() const {
    return model + " " + link + " bucket_mb=" + fmt(bucket_mb);
  }
  static std::string fmt(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return b;
  }
};

std::vector<std::string> job_args(const Config& c, int steps, const std::string& run_dir) {
  return {"--set", "job.steps=" + std::to_string(steps), "--set", "job.threads_per_rank=1",
          "--set", "comm.bucket_mb=" + Config::fmt(c.bucket_mb), "--set", "eval.every=0",
          "--set", "job.run_dir=" + run_dir, "--set", "fault.heartbeat_s=0.5"};
}

// One run; returns the median step time in seconds (negative: failed).
double run_once(const Config& c, int steps, NetHosts& hosts) {
  const std::string job = std::string(LOCKSTEP_SOURCE_DIR) + "/examples/fashion_mnist_" + c.model + ".toml";
  TempDir dir;
  const std::string runs = dir.path() + "/runs";
  std::string output;
  if (c.link == "loopback") {
    std::vector<std::string> args = {"run", job, "--nproc", "2"};
    for (auto& a : job_args(c, steps, runs)) args.push_back(a);
    auto result = run_lockstep(args, dir.path(), 600);
    if (result.exit_code != 0) output = result.output;
  } else {
    const std::string rate = c.link == "veth" ? "" : c.link;
    hosts.cap("w1", rate);
    hosts.cap("w2", rate);
    std::vector<std::string> args = {"coordinator", job, "--listen", hosts.address("coord") + ":29400"};
    for (auto& a : job_args(c, steps, runs)) args.push_back(a);
    const std::vector<std::string> env = {"LOCKSTEP_TOKEN=" + kToken};
    LockstepProcess coordinator(args, dir.path(), env, hosts.on("coord"));
    std::vector<std::unique_ptr<LockstepProcess>> workers;
    for (const std::string host : {"w1", "w2"})
      workers.push_back(std::make_unique<LockstepProcess>(
          std::vector<std::string>{"worker", "--coordinator", hosts.address("coord") + ":29400"},
          dir.path(), env, hosts.on(host)));
    if (coordinator.wait(600) != 0) output = coordinator.output() + workers[0]->output();
    for (auto& w : workers) w->wait(30);
  }
  if (!output.empty()) {
    std::fprintf(stderr, "%s failed:\n%s\n", c.name().c_str(), output.c_str());
    return -1;
  }
  const json manifest = read_json(single_run(runs) + "/manifest.json");
  return manifest["metrics"].value("step_s_median", -1.0);
}

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  const int steps = argc > 2 ? std::max(20, std::atoi(argv[2])) : 60;
  if (const std::string why = NetHosts::unavailable(); !why.empty()) {
    std::fprintf(stderr, "multihost_links: %s\n", why.c_str());
    return 77;
  }
  TempDir files;
  NetHosts hosts(files.path());
  hosts.add("coord");
  hosts.add("w1");
  hosts.add("w2");

  std::vector<Config> configs;
  for (const std::string model : {"cnn", "mlp"})
    for (const std::string link : {"loopback", "veth", "1gbit", "100mbit"})
      configs.push_back({model, link, 1});
  configs.push_back({"cnn", "100mbit", 25});
  configs.push_back({"cnn", "veth", 25});

  std::map<std::string, std::vector<double>> step_s, vs_loopback;
  for (int rep = 0; rep < repetitions; ++rep) {
    std::map<std::string, double> loopback;
    for (const auto& c : configs) {
      const double s = run_once(c, steps, hosts);
      if (s <= 0) return 1;
      step_s[c.name()].push_back(s);
      if (c.link == "loopback") loopback[c.model] = s;
      vs_loopback[c.name()].push_back(s / loopback.at(c.model));
      std::fprintf(stderr, "rep %d/%d  %-30s %8.2f ms\n", rep + 1, repetitions, c.name().c_str(), 1e3 * s);
    }
  }
  hosts.cap("w1", "");
  hosts.cap("w2", "");

  json results = json::array();
  std::fprintf(stderr, "\n%-6s %-9s %-9s %18s %22s\n", "model", "link", "bucket_mb", "step ms (min-max)",
               "x loopback (min-max)");
  for (const auto& c : configs) {
    const json s = summary(step_s[c.name()]);
    const json r = summary(vs_loopback[c.name()]);
    results.push_back({{"model", c.model}, {"link", c.link}, {"bucket_mb", c.bucket_mb},
                       {"step_s", s}, {"step_time_vs_loopback", r}});
    std::fprintf(stderr, "%-6s %-9s %-9s %7.1f (%.1f-%.1f) %10.2f (%.2f-%.2f)\n", c.model.c_str(),
                 c.link.c_str(), Config::fmt(c.bucket_mb).c_str(), 1e3 * s["median"].get<double>(),
                 1e3 * s["min"].get<double>(), 1e3 * s["max"].get<double>(), r["median"].get<double>(),
                 r["min"].get<double>(), r["max"].get<double>());
  }
  json out = {{"benchmark", "multihost_links"},
              {"setup",
               {{"machine", cpu_model()}, {"cores", std::thread::hardware_concurrency()},
                {"ranks", 2}, {"threads_per_rank", 1}, {"steps", steps},
                {"data", "Fashion-MNIST, examples/fashion_mnist_<model>.toml (batch 64 per rank)"},
                {"repetitions", repetitions},
                {"hosts", "coordinator and each rank on a network-namespace host, veth into a bridge; "
                          "links capped with tc tbf on both ends (burst 256kbit, latency 400ms)"},
                {"order", "interleaved: every configuration once per repetition"},
                {"figure", "each run's median step time after 10 warm-up steps; ratios within a "
                           "repetition"}}},
              {"results", results}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

// Benchmark: what the rank-drift audit costs. For the mlp and the cnn, runs
// `lockstep run` with 2 ranks at audit.every = off, 100, 10, 1, interleaved,
// several repetitions, and prints JSON: the audit phase's share of the step
// time measured inside each run (robust against a noisy machine), and the
// step time against the audit-off run of the same repetition (noisier).
// Usage: audit_overhead [repetitions=5]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_figures.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using lockstep::bench::summary;

struct Sample {
  double step_s = 0;        // wall time per step in training (incl. audits)
  double audit_share = 0;   // audit seconds / training seconds without audits
};

Sample run_once(const std::string& model, int steps, int every, const std::string& dir) {
  const std::string runs = dir + "/runs-" + model + "-" + std::to_string(every);
  fs::remove_all(runs);
  std::string command = std::string(LOCKSTEP_EXE) + " run " + LOCKSTEP_SOURCE_DIR +
                        "/examples/synthetic.toml --nproc 2 --set model.name=" + model +
                        " --set job.steps=" + std::to_string(steps) +
                        " --set data.batch_size=64 --set job.log_every=1000 --set eval.every=0"
                        " --set audit.every=" + std::to_string(every) + " --set job.run_dir=" + runs +
                        " > " + dir + "/last.log 2>&1";
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr, "run failed: %s (see %s/last.log)\n", command.c_str(), dir.c_str());
    std::exit(1);
  }
  fs::path folder = fs::directory_iterator(runs)->path();
  std::ifstream in(folder / "manifest.json");
  json phases = json::parse(in)["phases"];
  const double train = phases["data"].get<double>() + phases["forward_backward"].get<double>() +
                       phases["comm_wait"].get<double>() + phases["optimizer"].get<double>();
  const double audit = phases["audit"].get<double>();
  return {(train + audit) / steps, audit / train};
}

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  char pattern[] = "/tmp/lockstep-bench-XXXXXX";
  const std::string dir = ::mkdtemp(pattern);
  const std::vector<int> everies = {0, 100, 10, 1};
  json results = json::array();
  for (const auto& [model, steps] : std::vector<std::pair<std::string, int>>{{"mlp", 400}, {"cnn", 150}}) {
    std::vector<std::vector<double>> ratio(everies.size()), share(everies.size()), step(everies.size());
    for (int rep = 0; rep < repetitions; ++rep) {
      std::vector<Sample> samples;
      for (int every : everies) samples.push_back(run_once(model, steps, every, dir));
      for (size_t i = 0; i < everies.size(); ++i) {
        ratio[i].push_back(samples[i].step_s / samples[0].step_s);
        share[i].push_back(samples[i].audit_share);
        step[i].push_back(samples[i].step_s * 1000);
      }
      std::fprintf(stderr, "%s repetition %d/%d done\n", model.c_str(), rep + 1, repetitions);
    }
    for (size_t i = 0; i < everies.size(); ++i)
      results.push_back({{"model", model},
                         {"audit_every", everies[i] == 0 ? json("off") : json(everies[i])},
                         {"step_ms", summary(step[i])},
                         {"audit_share_of_step", summary(share[i])},
                         {"step_time_vs_audit_off", summary(ratio[i])}});
  }
  fs::remove_all(dir);
  json out = {{"benchmark", "audit_overhead"},
              {"setup",
               {{"ranks", 2}, {"data", "synthetic, batch 64 per rank"}, {"repetitions", repetitions},
                {"order", "interleaved: off, 100, 10, 1 within each repetition"},
                {"cores", std::thread::hardware_concurrency()},
                {"audit_share", "audit phase seconds / training seconds of the same run"}}},
              {"results", results}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

#pragma once
// Shared pieces of the integration tests: the synthetic example job with a
// run folder inside the test's own temp folder.
#include <string>
#include <vector>

#include "support/cli_runner.h"

namespace lockstep::testing {

// `lockstep run examples/synthetic.toml --nproc N --set job.run_dir=<dir>/runs` + sets.
inline std::vector<std::string> synthetic_run(const TempDir& dir, int nproc,
                                              std::vector<std::string> sets) {
  std::vector<std::string> args = {"run", examples_dir() + "/synthetic.toml", "--nproc",
                                   std::to_string(nproc), "--set", "job.run_dir=" + dir.path() + "/runs"};
  for (auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  return args;
}

}  // namespace lockstep::testing

#pragma once
// `lockstep audit RUN_DIR`: reads the per-rank audit evidence of a finished
// (or failed) run, without any process group, and says whether all ranks
// agreed at every audited step, and if not, where they first parted, which
// tensors and ranks, and whether they ever agreed again.
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep {

struct AuditReport {
  int exit_code = 0;   // 0 all agreed, 1 drifted, 2 evidence missing/truncated/inconsistent
  std::string text;    // for people
  nlohmann::json json; // for scripts
};

// Never throws for bad evidence: that is exit_code 2 with each problem named.
AuditReport audit_run_folder(const std::string& run_dir);

}  // namespace lockstep

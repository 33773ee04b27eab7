#pragma once
// The in-run rank-drift audit (step 5 of the data flow). At an audit every
// rank digests every parameter and buffer in place (xxh3 of the exact
// bytes) and hashes its random generator's state; the digests are
// all-gathered on the control group, never the data group: 16 bytes per
// tensor plus 8. On a mismatch every rank learns which tensors differ,
// which ranks hold which version, and each rank's max |difference| from
// rank 0 (only the differing tensors are broadcast); then audit.policy
// applies: warn, fail (RunError on every rank), or resync (rank 0's
// parameters, buffers and optimizer state broadcast to all).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/job/config.h"
#include "runtime/comm/control_group.h"
#include "runtime/model/digest.h"
#include "runtime/run/run_folder.h"

namespace lockstep::optim {
class Optimizer;
}

namespace lockstep {

class Model;

struct AuditFinding {
  std::string tensor;
  bool buffer = false;
  std::vector<std::vector<int>> groups;  // ranks that hold the same version, rank 0's first
  std::vector<double> max_abs_diff;      // per rank, against rank 0
  nlohmann::json to_json() const;
};

struct AuditResult {
  int64_t step = 0;
  bool agreed = true;            // every audited tensor identical on every rank
  bool streams_distinct = true;  // every rank's generator state differs from the others'
  std::vector<AuditFinding> findings;
  std::string action = "none";   // none | warned | failed | resynced
  // "agree", or "DRIFT: fc2.bias ranks {0} vs {1} max|diff| 1e-07; ..."
  std::string verdict() const;
  nlohmann::json to_json() const;
};

class Auditor {
 public:
  // `evidence` receives one JSON line per audit (audit-rank<N>.jsonl).
  Auditor(const AuditSection& options, ControlGroup& control, Model& model, EventWriter& evidence);

  // True at the first step, every `every` steps and at the last step.
  bool due(int64_t step, int64_t total_steps) const;

  // An audit is start() and, later, finish(); every rank makes the same
  // calls at the same steps.
  // Digests the state after optimizer step `step` and starts their
  // all-gather, so that it can travel while the next step computes. The
  // state must not change before finish(): call finish() before the next
  // optimizer step.
  void start(int64_t step);
  bool started() const { return pending_.has_value(); }
  // Waits for the all-gather, compares, logs, writes the evidence and
  // applies audit.policy. Throws RunError under policy fail.
  AuditResult finish(optim::Optimizer& optimizer);

 private:
  void resync(optim::Optimizer& optimizer);

  struct Pending {
    int64_t step = 0;
    std::vector<std::string> names;
    std::vector<bool> buffers;
    std::vector<TensorDigest> digests;
    uint64_t rng = 0;
    std::string digest_kind = "none";  // of the digests: xxh3-128 (CPU) | lanes-128 (CUDA)
    at::Tensor local;                   // keeps the gathered input alive
    std::vector<at::Tensor> gathered;   // one per rank
    std::optional<PendingCollective> work;
  };
  std::optional<Pending> pending_;

  AuditSection options_;
  ControlGroup& control_;
  Model& model_;
  EventWriter& evidence_;
};

}  // namespace lockstep

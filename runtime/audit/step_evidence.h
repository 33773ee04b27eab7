#pragma once
// What a run keeps to prove its arithmetic afterwards, and what a replay
// checks it against. Per step and rank, one line of the rank's audit
// evidence (audit-rank<N>.jsonl, event "step_evidence"): the digest of each
// microbatch's gradient and loss the rank computed (before any sum), on
// rank 0 every audit.every steps and at the end the digests of the state
// the step left (parameters, buffers), the world
// size, generation, host and the checkpoint the step follows, in
// step-evidence-g<G>-rank<N>.jsonl beside the audits. Digests, not tensors: a
// few hundred bytes per step. A step that did not end (a failure, an
// exclusion) leaves no line: what is recorded was applied.
//
// The state a step left: a digest of the parameters and one of the
// buffers ("" when the model has none), apart, because a buffer policy
// other than comm.buffers = mean ties the buffers to the world size.
struct StateDigest {
  std::string parameters, buffers;
};

// A StepEvidence is told of every microbatch and every step's end by the
// trainer; the recorder writes the lines, a replay (`lockstep verify`)
// compares them.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "runtime/base/errors.h"
#include "runtime/model/digest.h"
#include "runtime/run/run_folder.h"

namespace lockstep {

// One microbatch's gradient (a digest per parameter, registration order)
// and its loss, as computed before anything was summed.
struct MicrobatchDigest {
  int64_t step = 0;   // 1-based optimizer step
  int64_t index = 0;  // j in the step's global batch, whichever rank computed it
  std::vector<TensorDigest> tensors;
  double loss_sum = 0;  // the microbatch's loss sum, exactly as computed
  double valid = 0;     // its valid targets
  // 16 hex digits over every tensor digest and the loss: what the evidence keeps.
  std::string combined() const;
};

// Digests of one microbatch's gradients as accumulated into zeroed
// buffers (an undefined tensor: a parameter without a gradient, zeros).
MicrobatchDigest digest_microbatch(int64_t step, int64_t index, const std::vector<at::Tensor>& gradients,
                                   double loss_sum, double valid);

class StepEvidence {
 public:
  virtual ~StepEvidence() = default;
  // After each microbatch's backward, in the order computed.
  virtual void on_microbatch(const MicrobatchDigest& microbatch) = 0;
  // After step `step` (1-based) ended, updated or skipped: the state it
  // left (empty digests: this rank does not record it).
  virtual void on_step_end(int64_t step, const StateDigest& state) = 0;
  // The following steps continue from the checkpoint of step `step` (0:
  // the run's start): one was written, or the run resumed from it.
  virtual void on_checkpoint(int64_t step) { (void)step; }
  // A replay ends after this step (0: the run's end).
  virtual int64_t last_step() const { return 0; }
};

// Writes the evidence of a run, one line per step, into `out`.
class EvidenceRecorder : public StepEvidence {
 public:
  struct Where {
    int rank = 0;
    int world_size = 1;
    int64_t generation = 1;
    std::string host;
    int threads = 1;  // intra-op threads: kernels sum in an order set by them
  };
  EvidenceRecorder(EventWriter& out, Where where) : out_(out), where_(std::move(where)) {}
  void on_checkpoint(int64_t step) override { checkpoint_ = step; }
  void on_microbatch(const MicrobatchDigest& microbatch) override;
  void on_step_end(int64_t step, const StateDigest& state) override;

 private:
  EventWriter& out_;
  Where where_;
  int64_t checkpoint_ = -1;  // unknown (a state received in memory) until told
  nlohmann::json pending_ = nlohmann::json::array();
};

// One rank's line of evidence for one step, as read back.
struct StepRecord {
  int64_t step = 0;
  int rank = 0;
  int world_size = 0;
  int64_t generation = 0;
  std::string host;
  int threads = 0;  // 0: not recorded
  int64_t after_checkpoint = -1;  // -1: unknown (the step continued from a state in memory)
  StateDigest state;                          // "" where the line has none
  std::map<int64_t, std::string> microbatches;  // index -> combined digest
  std::map<int64_t, double> losses;             // index -> loss sum
  std::string file;                             // where it was read, for messages
  int64_t line = 0;
};

// The evidence of a run folder, every step's records from every
// step-evidence-*.jsonl. A trust boundary: lines are bounded (1 MiB), values
// checked for type and range; a line that is not valid evidence is an
// InputError naming the file and line. Lines of other events are skipped.
struct RunEvidence {
  std::map<int64_t, std::vector<StepRecord>> steps;
  int64_t lines = 0;
};
RunEvidence read_run_evidence(const std::string& run_dir);

// A replay that computed something other than what a run recorded.
class ReplayMismatch : public RunError {
 public:
  ReplayMismatch(const std::string& what, int64_t step, int64_t microbatch, int rank)
      : RunError(what), step(step), microbatch(microbatch), rank(rank) {}
  int64_t step, microbatch;  // microbatch -1: the step's state
  int rank;
};

// step-evidence-g<generation>-rank<N>.jsonl: one process's, in one
// generation (an elastic job's ranks are numbered again in each).
std::string step_evidence_file(int64_t generation, int rank);

// Compares a replay with a run's evidence, step by step: every recorded
// digest of a microbatch the replay computes, and of the state after each
// step, must equal the replay's. Throws ReplayMismatch at the first that differs.
class ReplayCheck : public StepEvidence {
 public:
  // Steps [first, last] are compared (the replay may start before first).
  // `buffers`: whether the buffers' digests are compared too (not when the
  // run's buffer policy tied them to its world size).
  ReplayCheck(const RunEvidence& evidence, int64_t first, int64_t last, bool buffers = true)
      : evidence_(evidence), first_(first), last_(last), buffers_(buffers) {}
  void on_microbatch(const MicrobatchDigest& microbatch) override;
  void on_step_end(int64_t step, const StateDigest& state) override;
  int64_t last_step() const override { return last_; }

  int64_t steps_checked() const { return steps_checked_; }
  int64_t microbatches_checked() const { return microbatches_checked_; }  // digests compared
  int64_t states_checked() const { return states_checked_; }

 private:
  const RunEvidence& evidence_;
  int64_t first_, last_;
  bool buffers_;
  int64_t steps_checked_ = 0, microbatches_checked_ = 0, states_checked_ = 0;
};

}  // namespace lockstep

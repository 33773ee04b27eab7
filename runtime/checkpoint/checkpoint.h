#pragma once
// A rank's part of a training checkpoint (step 6 of the data flow). Rank 0
// writes the shared state (parameters and buffers, optimizer state), every
// rank its own random-generator state; once all have written (a control
// barrier) rank 0 seals the checkpoint with its index, then a second barrier,
// so no rank goes on believing in a checkpoint that is not complete.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint/checkpoint_store.h"
#include "runtime/job/config.h"

namespace lockstep {

class ControlGroup;
class DecisionLog;
class Model;
namespace optim {
class Optimizer;
}

// `meta` goes into the index (step, data position, settings that must not
// change on resume); the parameter digest is added here.
void write_checkpoint(const CheckpointStore& store, int64_t step, nlohmann::json meta, Model& model,
                      const optim::Optimizer& optimizer, int rank, ControlGroup& control, int keep);

// The newest checkpoint under run folder `run_dir` that verifies, the same
// on every rank (a decision names any newer one refused and why). Throws
// InputError when the job changed a setting that a resumed run cannot change
// (naming the key), and when none verifies: for --resume (checkpoint.resume);
// after an automatic restart (`restarted`) that means the start, step 0.
std::optional<FoundCheckpoint> choose_checkpoint_to_resume(const JobConfig& config,
                                                           const std::string& run_dir,
                                                           bool restarted, int world_size,
                                                           ControlGroup& control,
                                                           DecisionLog& decisions);

// Loads a checkpoint's parameters, buffers, optimizer state and this rank's
// random stream, then checks the parameter digest against the checkpoint's.
void load_checkpoint(const CheckpointStore& store, const FoundCheckpoint& found, Model& model,
                     optim::Optimizer& optimizer, int rank);

// A rank's training state at a step boundary, held in memory while an
// elastic job changes its world size: what a checkpoint holds (parameters
// and buffers, optimizer state, the index's meta with the parameter
// digest), so that the job goes on from the step it stopped at without
// reading one. Every microbatch reseeds its random streams, so no rank's
// generator is needed.
struct StateInMemory {
  int64_t step = 0;
  nlohmann::json meta;              // as a checkpoint's index: step, param_digest, ...
  std::string model, optimizer;     // model.pt and optimizer.bin, as a checkpoint writes them
  // One byte string, to travel to a rank that has none (over c10d, never
  // gRPC), and back: from_bytes checks every length against what it was
  // given and throws RunError on anything else.
  std::string to_bytes() const;
  static StateInMemory from_bytes(const std::string& bytes);
};

// The state after step `step` (meta as for write_checkpoint).
StateInMemory capture_state(int64_t step, nlohmann::json meta, Model& model, const optim::Optimizer& optimizer);
// What a state is, independent of how its bytes were serialised (an archive
// carries a serialisation id of its own): its step, the digest of its
// parameters and buffers, and that of its optimizer state.
std::string state_identity(const StateInMemory& state);
// Loads it and checks the parameter digest, like load_checkpoint.
void load_state(const StateInMemory& state, Model& model, optim::Optimizer& optimizer, int rank);

}  // namespace lockstep

#pragma once
// A rank's training state held in memory across an elastic job's
// generations, and how the ranks of a new generation agree on it.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep {

class ControlGroup;
class DecisionLog;
class EventWriter;
class Model;
namespace optim {
class Optimizer;
}

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

// A new generation's start, on every rank together: the state the
// survivors hold (`kept`, taken and emptied here) after the furthest step
// any of them finished (a rank that finished one more step than the others
// holds exactly what they would have: every rank computes the same bits),
// the same on every rank that holds that step (checked: step, parameter
// and buffer digest, optimizer state digest), sent from the lowest such
// rank to every other rank over the control group's Gloo (the data plane,
// never gRPC) and checked again on arrival (the sender's byte checksum, the
// digests once loaded). Empty when no rank holds one, or when ranks holding
// the same step disagree: then the newest checkpoint is read, and a
// decision says why. Decides and logs `resume_from`; an event records the
// transfer.
std::optional<StateInMemory> state_for_new_generation(ControlGroup& control, std::optional<StateInMemory>& kept,
                                                      int rank, DecisionLog& decisions, EventWriter& events);

}  // namespace lockstep

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
                                                           DecisionLog& decisions,
                                                           int64_t at_most = INT64_MAX);

// Loads a checkpoint's parameters, buffers, optimizer state and this rank's
// random stream, then checks the parameter digest against the checkpoint's.
void load_checkpoint(const CheckpointStore& store, const FoundCheckpoint& found, Model& model,
                     optim::Optimizer& optimizer, int rank);

// The pieces a checkpoint and a state held in memory (state_in_memory.h)
// share: parameters and buffers as model.pt bytes (on the host whatever
// the device), loaded back onto the model's device with every name and
// shape checked (RunError naming `where`), and the check of the loaded
// parameters' digest against the one recorded in `meta`.
std::string model_bytes(Model& model);
void load_model_bytes(const std::string& bytes, Model& model, const std::string& where);
void check_loaded_digest(Model& model, const nlohmann::json& meta, const std::string& where, int rank);

}  // namespace lockstep

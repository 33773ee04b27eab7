#include "runtime/checkpoint/checkpoint.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "optim/optimizer.h"
#include "runtime/comm/control_group.h"
#include "runtime/run/decisions.h"
#include "runtime/model/digest.h"
#include "runtime/base/errors.h"
#include "runtime/model/model.h"

namespace lockstep {
namespace {

// The state of the default generator on `device`, which must be restored for
// the same draws after a resume (dropout on CUDA tensors draws from the GPU's).
std::string generator_state(const c10::Device& device) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  const at::Tensor state = generator.get_state();
  return std::string(reinterpret_cast<const char*>(state.data_ptr<uint8_t>()), size_t(state.numel()));
}

void set_generator_state(const c10::Device& device, const std::string& bytes) {
  at::Tensor state = torch::empty({int64_t(bytes.size())}, torch::kUInt8);
  std::memcpy(state.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  at::Generator generator = at::globalContext().defaultGenerator(device);  // a handle to the default
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

std::string archive_bytes(torch::serialize::OutputArchive& archive) {
  std::string bytes;
  archive.save_to([&](const void* data, size_t size) {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  return bytes;
}

}  // namespace

// Parameters and buffers, on the host whatever the device: the state
// resumes on a CPU or a GPU.
std::string model_bytes(Model& model) {
  torch::serialize::OutputArchive tensors;
  for (const auto& [name, tensor] : model.parameters()) tensors.write(name, tensor.to(at::kCPU));
  for (const auto& [name, tensor] : model.buffers()) tensors.write(name, tensor.to(at::kCPU), true);
  return archive_bytes(tensors);
}

void load_model_bytes(const std::string& bytes, Model& model, const std::string& where) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size(), c10::Device(c10::kCPU));
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, at::Tensor target, bool buffer) {
    at::Tensor saved;
    if (!archive.try_read(name, saved, buffer))
      throw RunError(where + ": model.pt has no tensor " + name);
    if (!saved.sizes().equals(target.sizes()))
      throw RunError(where + ": " + name + " has shape " + c10::str(saved.sizes()) +
                     ", this model " + c10::str(target.sizes()));
    target.copy_(saved);  // onto the model's device
  };
  for (const auto& [name, tensor] : model.parameters()) load(name, tensor, false);
  for (const auto& [name, tensor] : model.buffers()) load(name, tensor, true);
}

void check_loaded_digest(Model& model, const nlohmann::json& meta, const std::string& where, int rank) {
  const std::string digest = combined_hex(model_digests(model, true));
  if (digest != meta.value("param_digest", ""))
    throw RunError(where + ": the parameters loaded on rank " + std::to_string(rank) +
                   " have digest " + digest + ", the checkpoint recorded " +
                   meta.value("param_digest", std::string("none")));
}

void write_checkpoint(const CheckpointStore& store, int64_t step, nlohmann::json meta, Model& model,
                      const optim::Optimizer& optimizer, int rank, ControlGroup& control, int keep) {
  const std::string tag = "checkpoint-" + std::to_string(step);
  // This rank's random stream (dropout masks), byte for byte; on a GPU its
  // device's stream too.
  store.write_file(step, "rng-rank" + std::to_string(rank) + ".bin", generator_state(c10::kCPU));
  if (model.device().is_cuda())
    store.write_file(step, "rng-cuda-rank" + std::to_string(rank) + ".bin", generator_state(model.device()));
  if (rank == 0) {
    store.write_file(step, "model.pt", model_bytes(model));
    const std::vector<uint8_t> state = optimizer.save_to_bytes();
    store.write_file(step, "optimizer.bin", std::string(state.begin(), state.end()));
  }
  control.barrier(tag + "-written");
  if (rank == 0) {
    meta["step"] = step;
    meta["param_digest"] = combined_hex(model_digests(model, true));
    meta["ranks"] = control.collectives().size();
    store.seal(step, meta, keep);
  }
  control.barrier(tag + "-sealed");
}

std::optional<FoundCheckpoint> choose_checkpoint_to_resume(const JobConfig& config,
                                                           const std::string& dir, bool restarted,
                                                           int world_size, ControlGroup& control,
                                                           DecisionLog& decisions, int64_t at_most) {
  const std::string what = restarted ? "the restart" : "--resume " + dir;
  CheckpointStore store(dir + "/checkpoints");
  std::vector<std::string> rejected;
  std::optional<FoundCheckpoint> found = store.newest_valid(&rejected, at_most);
  std::string refused;
  for (const auto& r : rejected) refused += (refused.empty() ? "" : "; ") + r;
  if (!found && !restarted)
    throw InputError(what + ": no complete checkpoint that verifies" +
                     (refused.empty() ? " (none was written: checkpoint.every = 0?)" : ": " + refused));
  const auto steps = control.exchange("resume-step", found ? std::to_string(found->step) : "none");
  for (size_t r = 0; r < steps.size(); ++r)
    if (steps[r] != steps[0])
      throw RunError(what + ": rank " + std::to_string(r) + " found the checkpoint of step " +
                     steps[r] + ", rank 0 that of step " + steps[0] +
                     " (do all ranks see the same run folder?)");
  if (!found) {
    decisions.record("resume_checkpoint", "none, step 0",
                     "restarted before any checkpoint was complete" +
                         (refused.empty() ? std::string() : " (refused: " + refused + ")") +
                         "; every rank starts the job again",
                     /*warn=*/true);
    return std::nullopt;
  }
  const nlohmann::json& meta = found->meta;
  if (const std::string conflict = resume_conflict(meta, config); !conflict.empty())
    throw InputError(what + ": " + conflict);
  if (const int64_t was = meta.value("world_size", int64_t(world_size)); was != world_size) {
    const bool exact = config.comm.summation == "exact";
    decisions.record("resume_world_size", std::to_string(was) + " -> " + std::to_string(world_size),
                     exact ? "the global batch (" + std::to_string(config.data.global_batch) + " in " +
                                 std::to_string(config.data.global_batch / config.data.microbatch) +
                                 " microbatches) is divided among " + std::to_string(world_size) +
                                 " ranks instead of " + std::to_string(was) + "; with comm.summation = "
                                 "exact and per-microbatch random streams the run continues on the bits "
                                 "of the one that never stopped (for a fixed job.threads_per_rank)"
                           : "comm.summation = float: the sums over " + std::to_string(world_size) +
                                 " ranks round differently than over " + std::to_string(was) +
                                 ", so the run continues, not bit-identical to the one that never stopped",
                     /*warn=*/!exact);
  }
  // Everything else may change (eval.every, logging, the step count, ...):
  // said out loud, so that a different result can be traced to it.
  if (meta.contains("settings")) {
    std::map<std::string, std::string> before;
    for (const auto& item : meta["settings"]) {
      const std::string text = item.get<std::string>();
      before[text.substr(0, text.find('='))] = text.substr(text.find('=') + 1);
    }
    std::string changed;
    for (const auto& text : effective_settings(config)) {
      const std::string key = text.substr(0, text.find('=')), value = text.substr(text.find('=') + 1);
      if (key == "checkpoint.resume" || !before.count(key) || before[key] == value) continue;
      // The same folder, written relative once and absolute now, is no change.
      if (key == "job.run_dir" && std::filesystem::absolute(before[key]).lexically_normal() ==
                                      std::filesystem::absolute(value).lexically_normal())
        continue;
      changed += (changed.empty() ? "" : ", ") + key + ": " + before[key] + " -> " + value;
    }
    if (!changed.empty())
      decisions.record("resume_settings_changed", changed,
                       "allowed: none of them is one a resumed run must keep (model.name, job.seed, "
                       "data.global_batch, data.microbatch, optim.name)",
                       /*warn=*/true);
  }
  decisions.record("resume_checkpoint", "step " + std::to_string(found->step),
                   refused.empty() ? "the newest complete checkpoint in " + dir + "; every file's "
                                     "checksum verified" + (restarted ? " (automatic restart)" : "")
                                   : "newer ones refused: " + refused,
                   /*warn=*/!refused.empty());
  return found;
}

void load_checkpoint(const CheckpointStore& store, const FoundCheckpoint& found, Model& model,
                     optim::Optimizer& optimizer, int rank) {
  const std::string where = "checkpoint at step " + std::to_string(found.step) + " (" + found.folder + ")";
  load_model_bytes(store.read_file(found, "model.pt"), model, where);
  {
    const std::string bytes = store.read_file(found, "optimizer.bin");
    optimizer.load_from_bytes(std::vector<uint8_t>(bytes.begin(), bytes.end()));
  }
  // A rank the checkpointed run did not have starts no stream of its own:
  // every microbatch reseeds from (seed, step, microbatch) anyway.
  const bool had_this_rank = rank < found.meta.value("ranks", int64_t(0));
  if (had_this_rank)
    set_generator_state(c10::kCPU, store.read_file(found, "rng-rank" + std::to_string(rank) + ".bin"));
  // The GPU's stream when the checkpoint was written on one and this rank
  // trains on one (the trainer's checkpoint_device decision says the rest).
  if (had_this_rank && model.device().is_cuda() &&
      found.meta.value("device", std::string("cpu")).rfind("cuda", 0) == 0)
    set_generator_state(model.device(), store.read_file(found, "rng-cuda-rank" + std::to_string(rank) + ".bin"));
  check_loaded_digest(model, found.meta, where, rank);
}

}  // namespace lockstep

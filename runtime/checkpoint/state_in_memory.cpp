#include "runtime/checkpoint/state_in_memory.h"

#include <chrono>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "optim/optimizer.h"
#include "runtime/base/errors.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/checkpoint_store.h"
#include "runtime/comm/control_group.h"
#include "runtime/model/digest.h"
#include "runtime/model/model.h"
#include "runtime/run/decisions.h"
#include "runtime/run/run_folder.h"

namespace lockstep {

namespace {

// The optimizer's state tensors and its step count, digested: what two
// ranks compare (their archives' bytes differ in a serialisation id).
std::string optimizer_digest(const optim::Optimizer& optimizer) {
  NamedDigests digests;
  for (size_t s = 0; s < optimizer.state().size(); ++s)
    for (size_t slot = 0; slot < optimizer.state()[s].size(); ++slot)
      digests.emplace_back(std::to_string(s) + "/" + std::to_string(slot), digest(optimizer.state()[s][slot]));
  digests.emplace_back("steps", TensorDigest{0, uint64_t(optimizer.steps_taken()), 0});
  return combined_hex(digests);
}

}  // namespace

StateInMemory capture_state(int64_t step, nlohmann::json meta, Model& model, const optim::Optimizer& optimizer) {
  StateInMemory state;
  state.step = step;
  meta["step"] = step;
  meta["param_digest"] = combined_hex(model_digests(model, true));
  meta["optimizer_digest"] = optimizer_digest(optimizer);
  meta["ranks"] = 0;  // no rank's generator: every microbatch reseeds
  state.meta = std::move(meta);
  state.model = model_bytes(model);
  const std::vector<uint8_t> bytes = optimizer.save_to_bytes();
  state.optimizer.assign(bytes.begin(), bytes.end());
  return state;
}

std::string state_identity(const StateInMemory& state) {
  return std::to_string(state.step) + " " + state.meta.value("param_digest", std::string("?")) + " " +
         state.meta.value("optimizer_digest", std::string("?"));
}

void load_state(const StateInMemory& state, Model& model, optim::Optimizer& optimizer, int rank) {
  const std::string where = "the state of step " + std::to_string(state.step) + " held in memory";
  load_model_bytes(state.model, model, where);
  optimizer.load_from_bytes(std::vector<uint8_t>(state.optimizer.begin(), state.optimizer.end()));
  check_loaded_digest(model, state.meta, where, rank);
  if (const std::string loaded = optimizer_digest(optimizer); loaded != state.meta.value("optimizer_digest", ""))
    throw RunError(where + ": the optimizer state loaded on rank " + std::to_string(rank) + " has digest " + loaded +
                   ", the state recorded " + state.meta.value("optimizer_digest", std::string("none")));
}

namespace {

// Lengths travel as 8 little-endian bytes.
void put_length(std::string& out, uint64_t n) {
  for (int i = 0; i < 8; ++i) out.push_back(char((n >> (8 * i)) & 0xff));
}

uint64_t take_length(const std::string& in, size_t& at) {
  if (in.size() - at < 8) throw RunError("a state held in memory is cut short (" + std::to_string(in.size()) + " bytes)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(in[at + size_t(i)])) << (8 * i);
  at += 8;
  return n;
}

std::string take_part(const std::string& in, size_t& at, const char* what) {
  const uint64_t n = take_length(in, at);
  if (n > in.size() - at)
    throw RunError(std::string("a state held in memory says its ") + what + " has " + std::to_string(n) +
                   " bytes, but " + std::to_string(in.size() - at) + " are left");
  std::string part = in.substr(at, size_t(n));
  at += size_t(n);
  return part;
}

}  // namespace

std::string StateInMemory::to_bytes() const {
  std::string out = "lockstep-state-1";
  const std::string header = meta.dump();
  for (const std::string* part : {&header, &model, &optimizer}) {
    put_length(out, part->size());
    out += *part;
  }
  return out;
}

StateInMemory StateInMemory::from_bytes(const std::string& bytes) {
  const std::string magic = "lockstep-state-1";
  if (bytes.compare(0, magic.size(), magic) != 0) throw RunError("not a state held in memory (no lockstep-state-1 header)");
  size_t at = magic.size();
  StateInMemory state;
  const std::string header = take_part(bytes, at, "meta");
  state.meta = nlohmann::json::parse(header, nullptr, false);
  if (!state.meta.is_object() || !state.meta.contains("step") || !state.meta["step"].is_number_integer())
    throw RunError("a state held in memory has no readable meta (an object with an integer step)");
  state.step = state.meta["step"].get<int64_t>();
  state.model = take_part(bytes, at, "model");
  state.optimizer = take_part(bytes, at, "optimizer state");
  if (at != bytes.size()) throw RunError("a state held in memory has " + std::to_string(bytes.size() - at) + " bytes too many");
  return state;
}

std::optional<StateInMemory> state_for_new_generation(ControlGroup& control, std::optional<StateInMemory>& kept,
                                                      int rank, DecisionLog& decisions, EventWriter& events) {
  const auto started = std::chrono::steady_clock::now();
  // What each rank holds: step, content digests, and the checksum of the
  // bytes it would send (which only the transfer checks: two archives of
  // the same tensors differ in their serialisation ids).
  const std::string bytes = kept ? kept->to_bytes() : std::string();
  const std::string mine = kept ? state_identity(*kept) + " " + checksum_hex(bytes) : "";
  kept.reset();  // this generation keeps its own, if it ends under it
  const auto held = control.exchange("kept-state", mine);
  auto step_of = [](const std::string& entry) { return std::stoll(entry.substr(0, entry.find(' '))); };
  int source = -1;
  for (size_t r = 0; r < held.size(); ++r)
    if (!held[r].empty() && (source < 0 || step_of(held[r]) > step_of(held[size_t(source)]))) source = int(r);
  if (source < 0) return std::nullopt;
  std::string holders, receivers, differ;
  auto identity = [](const std::string& entry) { return entry.substr(0, entry.rfind(' ')); };
  for (size_t r = 0; r < held.size(); ++r) {
    const bool same_step = !held[r].empty() && step_of(held[r]) == step_of(held[size_t(source)]);
    std::string& list = same_step ? holders : receivers;
    list += (list.empty() ? "" : ", ") + std::to_string(r);
    if (same_step && identity(held[r]) != identity(held[size_t(source)]))
      differ += (differ.empty() ? "" : "; ") + std::to_string(r);
  }
  if (!differ.empty()) {
    decisions.record("resume_from", "the newest checkpoint",
                     "ranks hold the state of step " + std::to_string(step_of(held[size_t(source)])) +
                         " in memory with different digests (rank " + std::to_string(source) + " against " +
                         differ + "): they are apart, and no state in memory is trusted",
                     /*warn=*/true);
    return std::nullopt;
  }
  const std::string expected = held[size_t(source)];
  const int64_t size = int64_t(rank == source ? bytes.size() : 0);
  at::Tensor length = torch::tensor({size}, torch::kLong);
  control.collectives().broadcast(length, source);
  at::Tensor payload = rank == source ? torch::from_blob(const_cast<char*>(bytes.data()), {int64_t(bytes.size())},
                                                         torch::kUInt8).clone()
                                      : torch::empty({length.item<int64_t>()}, torch::kUInt8);
  control.collectives().broadcast(payload, source);
  const std::string received(reinterpret_cast<const char*>(payload.data_ptr<uint8_t>()), size_t(payload.numel()));
  StateInMemory state = StateInMemory::from_bytes(received);
  if (state_identity(state) + " " + checksum_hex(received) != expected)
    throw RunError("the state rank " + std::to_string(source) + " sent (step " + std::to_string(state.step) +
                   ") does not match its checksum on rank " + std::to_string(rank) + ": the transfer corrupted it");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  decisions.record("resume_from", "memory, step " + std::to_string(state.step),
                   "an elastic generation: rank(s) " + holders + " held the state after step " +
                       std::to_string(state.step) + " in memory (the same digests on each); rank " +
                       std::to_string(source) + " sent it (" + fmt::format("{:.1f}", double(received.size()) / 1e6) +
                       " MB, " + fmt::format("{:.2f}", seconds) + " s) to every rank over the control group" +
                       (receivers.empty() ? "" : ", for rank(s) " + receivers + " that held none or an older one") +
                       "; no checkpoint read");
  events.write({{"event", "state_transfer"}, {"step", state.step}, {"source_rank", source},
                {"bytes", received.size()}, {"seconds", seconds}, {"receivers", receivers}});
  return state;
}

}  // namespace lockstep

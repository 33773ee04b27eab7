#include "runtime/audit/audit.h"

#include <cstring>
#include <map>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "optim/optimizer.h"
#include "runtime/model/digest.h"
#include "runtime/base/errors.h"
#include "runtime/model/model.h"

namespace lockstep {
namespace {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
  bool buffer;
};

std::vector<NamedTensor> audited_tensors(Model& model, bool buffers) {
  std::vector<NamedTensor> out;
  for (const auto& [name, tensor] : model.parameters()) out.push_back({name, tensor, false});
  if (buffers)
    for (const auto& [name, tensor] : model.buffers()) out.push_back({name, tensor, true});
  return out;
}

// The CPU generator's state, and on a CUDA rank that of its device's
// generator too (dropout on CUDA tensors draws from it).
uint64_t generator_state_hash(const c10::Device& device) {
  uint64_t hash = 0;
  for (const c10::Device& where : {c10::Device(c10::kCPU), device}) {
    if (where.is_cpu() && hash != 0) break;
    at::Generator generator = at::globalContext().defaultGenerator(where);
    at::Tensor state;
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      state = generator.get_state();
    }
    hash = hash * 31 + hash_bytes(state.data_ptr(), size_t(state.numel()));
  }
  return hash;
}

int64_t bits_of(double x) {
  int64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

double double_of(int64_t bits) {
  double x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

std::string groups_text(const std::vector<std::vector<int>>& groups) {
  std::string out;
  for (const auto& group : groups) {
    out += out.empty() ? "ranks {" : " vs {";
    for (size_t i = 0; i < group.size(); ++i) out += (i ? "," : "") + std::to_string(group[i]);
    out += "}";
  }
  return out;
}


}  // namespace

nlohmann::json AuditFinding::to_json() const {
  return {{"tensor", tensor}, {"buffer", buffer}, {"groups", groups}, {"max_abs_diff", max_abs_diff}};
}

std::string AuditResult::verdict() const {
  std::string out = agreed ? "agree" : "DRIFT:";
  for (const auto& f : findings) {
    double worst = 0;
    for (double d : f.max_abs_diff) worst = std::max(worst, d);
    char diff[32];
    std::snprintf(diff, sizeof diff, "%.3g", worst);
    out += " " + f.tensor + " " + groups_text(f.groups) + " max|diff| " + diff + ";";
  }
  if (!streams_distinct) out += " (random streams equal on some ranks)";
  if (action == "resynced") out += " -> resynced from rank 0";
  return out;
}

nlohmann::json AuditResult::to_json() const {
  nlohmann::json found = nlohmann::json::array();
  for (const auto& f : findings) found.push_back(f.to_json());
  return {{"step", step}, {"agreed", agreed}, {"streams_distinct", streams_distinct},
          {"findings", found}, {"action", action}, {"verdict", verdict()}};
}

Auditor::Auditor(const AuditSection& options, ControlGroup& control, Model& model,
                 EventWriter& evidence)
    : options_(options), control_(control), model_(model), evidence_(evidence) {}

bool Auditor::due(int64_t step, int64_t total_steps) const {
  if (options_.every <= 0) return false;
  return step == 1 || step % options_.every == 0 || step == total_steps;
}

void Auditor::start(int64_t step) {
  torch::NoGradGuard no_grad;
  Pending p;
  p.step = step;
  std::vector<int64_t> local;
  for (const auto& t : audited_tensors(model_, options_.buffers == "check")) {
    p.names.push_back(t.name);
    p.buffers.push_back(t.buffer);
    p.digests.push_back(device_digest(t.tensor));  // where it lives: 16 bytes come back from a GPU
    p.digest_kind = kind_of_device_digest(t.tensor);
    local.push_back(int64_t(p.digests.back().high));
    local.push_back(int64_t(p.digests.back().low));
  }
  p.rng = generator_state_hash(model_.device());
  local.push_back(int64_t(p.rng));
  p.local = torch::tensor(local, torch::kInt64);
  p.work = control_.collectives().allgather_async(p.local, p.gathered);
  pending_ = std::move(p);
}

AuditResult Auditor::finish(optim::Optimizer& optimizer) {
  torch::NoGradGuard no_grad;
  Pending p = std::move(*pending_);
  pending_.reset();
  const int64_t step = p.step;
  AuditResult result;
  result.step = step;
  const int rank = control_.rank(), world = control_.size();
  try {
    p.work->wait();
  } catch (const std::exception& e) {
    throw CollectiveFailed("audit at step " + std::to_string(step) + ": the all-gather on the control "
                           "group failed on rank " + std::to_string(rank) + " (" + e.what() + ")");
  }
  auto value = [&](int r, size_t i) { return p.gathered[size_t(r)].data_ptr<int64_t>()[i]; };
  const size_t count = p.names.size();

  for (size_t t = 0; t < count; ++t) {
    std::map<std::pair<int64_t, int64_t>, std::vector<int>> versions;
    for (int r = 0; r < world; ++r) versions[{value(r, 2 * t), value(r, 2 * t + 1)}].push_back(r);
    if (versions.size() == 1) continue;
    AuditFinding finding;
    finding.tensor = p.names[t];
    finding.buffer = p.buffers[t];
    for (const auto& [hash, ranks] : versions)
      if (ranks.front() == 0) finding.groups.insert(finding.groups.begin(), ranks);
      else finding.groups.push_back(ranks);
    result.findings.push_back(finding);
  }
  std::map<int64_t, std::vector<int>> streams;
  for (int r = 0; r < world; ++r) streams[value(r, 2 * count)].push_back(r);
  result.streams_distinct = int(streams.size()) == world;
  result.agreed = result.findings.empty();

  // Each rank's max |difference| from rank 0, for the differing tensors only.
  if (!result.agreed) {
    auto tensors = audited_tensors(model_, options_.buffers == "check");
    std::vector<int64_t> diffs;
    for (const auto& f : result.findings) {
      const at::Tensor& mine =
          std::find_if(tensors.begin(), tensors.end(), [&](const NamedTensor& t) {
            return t.name == f.tensor;
          })->tensor;
      // The control group moves CPU tensors: the differing ones only come to the host.
      const at::Tensor on_host = mine.detach().to(at::kCPU, false, /*copy=*/true);
      at::Tensor reference = on_host.clone();
      control_.collectives().broadcast(reference, 0);
      diffs.push_back(bits_of((on_host.to(at::kDouble) - reference.to(at::kDouble)).abs().max().item<double>()));
    }
    auto all = control_.collectives().allgather(torch::tensor(diffs, torch::kInt64));
    for (size_t f = 0; f < result.findings.size(); ++f)
      for (int r = 0; r < world; ++r)
        result.findings[f].max_abs_diff.push_back(double_of(all[size_t(r)].data_ptr<int64_t>()[f]));
  }

  // The world size of this audit: an elastic job's changes from one
  // generation to the next, so that `lockstep audit` compares the ranks that were there.
  nlohmann::json evidence = {{"event", "audit"}, {"step", step}, {"rank", rank}, {"world_size", world},
                             {"rng", TensorDigest{0, p.rng, 0}.hex().substr(16)},
                             {"digest", p.digest_kind}};
  for (size_t t = 0; t < count; ++t) {
    evidence["tensors"][p.names[t]] = p.digests[t].hex();
    evidence["sums"][p.names[t]] = p.digests[t].sum;
  }
  evidence["agreed"] = result.agreed;
  evidence["streams_distinct"] = result.streams_distinct;

  if (!result.streams_distinct)
    spdlog::warn("audit at step {}: two or more ranks hold the same random generator state: they "
                 "draw identical dropout masks", step);
  if (!result.agreed) {
    for (const auto& f : result.findings) {
      std::string diffs;
      for (int r = 1; r < world; ++r) diffs += fmt::format(" rank {}: {:.3g};", r, f.max_abs_diff[size_t(r)]);
      spdlog::error("audit at step {}: {} '{}' differs across ranks: {}; max |diff| vs rank 0:{}",
                    step, f.buffer ? "buffer" : "parameter", f.tensor, groups_text(f.groups), diffs);
    }
    if (options_.policy == "fail") {
      result.action = "failed";
      evidence["action"] = result.action;
      evidence_.write(evidence);
      throw RunError("audit at step " + std::to_string(step) + ": the ranks disagree (" +
                     result.verdict() + "); audit.policy = fail stops the job");
    }
    if (options_.policy == "resync") {
      resync(optimizer);
      result.action = "resynced";
      spdlog::warn("audit at step {}: resynced every parameter, buffer and the optimizer state "
                   "from rank 0 (audit.policy = resync)", step);
    } else {
      result.action = "warned";
      spdlog::warn("audit at step {}: training goes on with ranks that disagree (audit.policy = "
                   "warn)", step);
    }
  }
  if (options_.buffers == "sync")
    for (const auto& [name, tensor] : model_.buffers()) {
      at::Tensor buffer = tensor;
      control_.collectives().broadcast(buffer, 0);
    }
  evidence["action"] = result.action;
  evidence_.write(evidence);
  return result;
}

void Auditor::resync(optim::Optimizer& optimizer) {
  for (auto& t : audited_tensors(model_, true)) {
    at::Tensor target = t.tensor.detach();
    control_.collectives().broadcast(target, 0);
  }
  std::vector<uint8_t> bytes = control_.rank() == 0 ? optimizer.save_to_bytes() : std::vector<uint8_t>{};
  at::Tensor size = torch::tensor({int64_t(bytes.size())}, torch::kInt64);
  control_.collectives().broadcast(size, 0);
  at::Tensor payload = torch::zeros({size.item<int64_t>()}, torch::kUInt8);
  if (control_.rank() == 0) std::memcpy(payload.data_ptr(), bytes.data(), bytes.size());
  control_.collectives().broadcast(payload, 0);
  if (control_.rank() != 0) {
    const auto* data = payload.data_ptr<uint8_t>();
    optimizer.load_from_bytes(std::vector<uint8_t>(data, data + payload.numel()));
  }
}

}  // namespace lockstep

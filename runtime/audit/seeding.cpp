#include "runtime/audit/seeding.h"

#include <map>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "runtime/model/digest.h"
#include "runtime/base/errors.h"

namespace lockstep {

void seed_everything(uint64_t seed) { torch::manual_seed(seed); }

uint64_t microbatch_seed(uint64_t seed, int64_t step, int64_t microbatch) {
  // splitmix64's finaliser over the three, each through an odd multiplier.
  uint64_t z = seed * 0x9E3779B97F4A7C15ULL ^ uint64_t(step) * 0xC2B2AE3D27D4EB4FULL ^
               uint64_t(microbatch) * 0x165667B19E3779F9ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFFULL;  // a seed torch::manual_seed takes as it is
}

std::string verify_identical_parameters(ControlGroup& control, const Model& model,
                                        DecisionLog& log) {
  NamedDigests digests = model_digests(model, /*buffers=*/true);
  std::vector<int64_t> flat;
  for (const auto& [name, d] : digests) {
    flat.push_back(int64_t(d.high));
    flat.push_back(int64_t(d.low));
  }
  auto all = control.allgather("init-parameters", flat);
  for (size_t t = 0; t < digests.size(); ++t) {
    std::map<std::pair<int64_t, int64_t>, std::vector<int>> versions;
    for (int r = 0; r < int(all.size()); ++r)
      versions[{all[r][2 * t], all[r][2 * t + 1]}].push_back(r);
    if (versions.size() == 1) continue;
    std::string groups;
    for (const auto& [hash, ranks] : versions) {
      groups += groups.empty() ? "" : " vs ";
      groups += "ranks {";
      for (size_t i = 0; i < ranks.size(); ++i) groups += (i ? "," : "") + std::to_string(ranks[i]);
      groups += "}";
    }
    throw RunError("parameters differ across ranks right after initialisation with the shared "
                   "seed: tensor '" + digests[t].first + "' has " +
                   std::to_string(versions.size()) + " versions (" + groups +
                   "); the model's initialisation is not a function of the seed alone");
  }
  std::string combined = combined_hex(digests);
  log.record("init_parameters", "identical on all " + std::to_string(control.size()) + " ranks",
             "digest " + combined + " over " + std::to_string(digests.size()) +
                 " tensors, all-gathered on the control group");
  return combined;
}

uint64_t dropout_mask_probe() {
  auto generator = at::detail::getDefaultCPUGenerator();
  at::Generator copy;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    copy = generator.clone();
  }
  at::Tensor mask = at::empty({4096}, at::kFloat).bernoulli_(0.5, copy).to(at::kByte);
  return hash_bytes(mask.data_ptr(), size_t(mask.numel()));
}

StreamCheck check_streams_differ(ControlGroup& control, DecisionLog& log) {
  StreamCheck check;
  auto all = control.allgather("random-streams", {int64_t(dropout_mask_probe())});
  std::map<uint64_t, std::vector<int>> owners;
  for (int r = 0; r < int(all.size()); ++r) {
    check.probes.push_back(uint64_t(all[r][0]));
    owners[uint64_t(all[r][0])].push_back(r);
  }
  std::string shared;
  for (const auto& [probe, ranks] : owners) {
    if (ranks.size() < 2) continue;
    check.all_distinct = false;
    shared += shared.empty() ? "ranks " : "; ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) shared += (i ? "," : "") + std::to_string(ranks[i]);
  }
  if (check.all_distinct) {
    log.record("random_streams", "distinct on all " + std::to_string(control.size()) + " ranks",
               "dropout masks drawn from a copy of each rank's generator all differ");
  } else {
    log.record("random_streams", "SHARED by " + shared,
               "these ranks draw identical dropout masks: they were not reseeded with seed + "
               "rank, so their randomness is not independent",
               /*warn=*/true);
  }
  return check;
}

}  // namespace lockstep

#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <torch/torch.h>

namespace lockstep::optim {
namespace {

// The gradients that live in one storage.
struct StorageGroup {
  std::vector<std::string> names;
  std::vector<at::Tensor> grads;
};

// For a storage with several gradients: a flat view of the storage and a
// mask of the elements some gradient covers, so each counts once.
std::pair<at::Tensor, at::Tensor> covered_elements(const StorageGroup& group) {
  const at::Tensor& first = group.grads.front();
  const int64_t length = int64_t(first.storage().nbytes()) / int64_t(first.element_size());
  at::Tensor flat = at::empty({0}, first.options()).set_(first.storage(), 0, {length}, {1});
  at::Tensor mask = at::zeros({length}, first.options().dtype(at::kBool));
  for (const auto& g : group.grads)
    mask.as_strided(g.sizes(), g.strides(), g.storage_offset()).fill_(true);
  return {flat, mask};
}

// Whether some element belongs to two of the group's gradients. Disjoint
// slices of one buffer (the reducer's buckets) are ordinary gradients.
bool elements_overlap(const StorageGroup& group) {
  std::vector<std::pair<int64_t, int64_t>> spans;  // [begin, end) of contiguous gradients
  for (const auto& g : group.grads) {
    if (!g.is_contiguous()) {
      auto [flat, mask] = covered_elements(group);
      int64_t total = 0;
      for (const auto& h : group.grads) total += h.numel();
      return mask.sum().item<int64_t>() < total;
    }
    spans.emplace_back(g.storage_offset(), g.storage_offset() + g.numel());
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second) return true;
  return false;
}

}  // namespace

ClipResult clip_grad_norm(const NamedTensors& params, double max_norm) {
  std::map<const void*, size_t> group_of_storage;
  std::vector<StorageGroup> by_storage;
  for (const auto& [name, param] : params) {
    const at::Tensor& grad = param.grad();
    if (!grad.defined()) continue;
    const void* key = grad.storage().unsafeGetStorageImpl();
    auto [it, added] = group_of_storage.emplace(key, by_storage.size());
    if (added) by_storage.emplace_back();
    by_storage[it->second].names.push_back(name);
    by_storage[it->second].grads.push_back(grad);
  }
  // Gradients in one storage that do not overlap are measured one by one.
  std::vector<StorageGroup> groups;
  for (auto& group : by_storage) {
    if (group.grads.size() == 1 || elements_overlap(group)) {
      groups.push_back(std::move(group));
      continue;
    }
    for (size_t i = 0; i < group.grads.size(); ++i)
      groups.push_back(StorageGroup{{group.names[i]}, {group.grads[i]}});
  }

  ClipResult result;
  double sum_squares = 0.0;
  // Per group: the elements to measure and a way to scale them once.
  std::vector<std::pair<at::Tensor, at::Tensor>> shared_views;
  for (const StorageGroup& group : groups) {
    if (group.grads.size() == 1) {
      const at::Tensor& g = group.grads.front();
      sum_squares += g.to(at::kDouble).pow(2).sum().item<double>();
      result.nonfinite += (~g.isfinite()).sum().item<int64_t>();
      continue;
    }
    result.shared_storage.push_back(group.names);
    auto [flat, mask] = covered_elements(group);
    at::Tensor values = flat.masked_select(mask);
    sum_squares += values.to(at::kDouble).pow(2).sum().item<double>();
    result.nonfinite += (~values.isfinite()).sum().item<int64_t>();
    shared_views.emplace_back(flat, mask);
  }
  result.total_norm = std::sqrt(sum_squares);

  if (max_norm <= 0 || !std::isfinite(result.total_norm) || result.total_norm <= max_norm)
    return result;
  const double coefficient = max_norm / (result.total_norm + 1e-6);
  for (const StorageGroup& group : groups)
    if (group.grads.size() == 1) group.grads.front().mul_(coefficient);
  for (auto& [flat, mask] : shared_views) {
    at::Tensor scaled = flat * coefficient;
    flat.copy_(at::where(mask, scaled, flat));
  }
  result.clipped = true;
  return result;
}

}  // namespace lockstep::optim

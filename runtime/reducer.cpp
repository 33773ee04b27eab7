#include "runtime/reducer.h"

#include <torch/torch.h>

namespace lockstep {

GradientReducer::GradientReducer(std::vector<std::pair<std::string, at::Tensor>> params,
                                 CollectiveGroup& group, ReducerOptions options)
    : params_(std::move(params)), group_(group) {
  Bucket current;
  int64_t bytes = 0;
  int64_t limit = std::min(options.first_bucket_bytes, options.bucket_bytes);
  for (size_t i = params_.size(); i-- > 0;) {
    const at::Tensor& p = params_[i].second;
    int64_t size = p.numel() * int64_t(p.element_size());
    if (!current.members.empty() && bytes + size > limit) {
      buckets_.push_back(std::move(current));
      current = Bucket{};
      bytes = 0;
      limit = options.bucket_bytes;
    }
    current.members.push_back(i);
    bytes += size;
  }
  if (!current.members.empty()) buckets_.push_back(std::move(current));
  for (size_t b = 0; b < buckets_.size(); ++b) {
    int64_t elements = b + 1 == buckets_.size() ? 1 : 0;  // the count rides in the last bucket
    for (size_t i : buckets_[b].members) elements += params_[i].second.numel();
    buckets_[b].flat = torch::zeros({elements}, params_.front().second.options());
  }
}

double GradientReducer::allreduce_mean(double local_count) {
  std::vector<PendingCollective> pending;
  std::vector<std::vector<at::Tensor>> inputs(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    int64_t offset = 0;
    for (size_t i : bucket.members) {
      at::Tensor& p = params_[i].second;
      int64_t n = p.numel();
      at::Tensor slot = bucket.flat.narrow(0, offset, n);
      if (p.grad().defined()) {
        slot.copy_(p.grad().reshape({n}));
      } else {
        slot.zero_();
      }
      offset += n;
    }
    if (b + 1 == buckets_.size()) bucket.flat[offset].fill_(local_count);
    inputs[b] = {bucket.flat};
    pending.push_back(group_.allreduce_sum(inputs[b]));
  }
  for (auto& work : pending) work.wait();

  const Bucket& last = buckets_.back();
  double global_count = last.flat[last.flat.numel() - 1].item<double>();
  const double scale = global_count > 0 ? 1.0 / global_count : 1.0;
  for (Bucket& bucket : buckets_) {
    int64_t offset = 0;
    for (size_t i : bucket.members) {
      at::Tensor& p = params_[i].second;
      int64_t n = p.numel();
      at::Tensor slot = bucket.flat.narrow(0, offset, n).view(p.sizes());
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      p.mutable_grad().copy_(slot).mul_(scale);
      offset += n;
    }
  }
  return global_count;
}

std::vector<std::vector<std::string>> GradientReducer::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& bucket : buckets_) {
    out.emplace_back();
    for (size_t i : bucket.members) out.back().push_back(params_[i].first);
  }
  return out;
}

}  // namespace lockstep

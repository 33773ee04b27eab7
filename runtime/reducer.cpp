#include "runtime/reducer.h"

#include <cmath>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

namespace lockstep {

GradientReducer::GradientReducer(std::vector<std::pair<std::string, at::Tensor>> params,
                                 CollectiveGroup& group, ReducerOptions options)
    : params_(std::move(params)), group_(group), options_(options) {
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
  // Members back to back from offset 0; the valid-sample count rides in one
  // extra slot at the end of the last bucket.
  places_.resize(params_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    int64_t offset = 0;
    for (size_t i : buckets_[b].members) {
      places_[i] = {b, offset};
      offset += params_[i].second.numel();
    }
    const int64_t count_slot = b + 1 == buckets_.size() ? 1 : 0;
    buckets_[b].flat = torch::zeros({offset + count_slot}, params_.front().second.options());
  }
  arrived_.assign(params_.size(), false);
  ever_arrived_.assign(params_.size(), false);
  if (options_.overlap)
    for (size_t i = 0; i < params_.size(); ++i)
      hooks_.push_back(params_[i].second.register_hook([this, i](const at::Tensor& grad) {
        on_gradient(i, grad);
      }));
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < hooks_.size(); ++i) params_[i].second.remove_hook(hooks_[i]);
}

void GradientReducer::begin_microbatch(int64_t micro, int64_t count, double local_count) {
  if (micro == 0) {
    for (auto& bucket : buckets_) {
      bucket.flat.zero_();
      bucket.launched = false;
      bucket.work.reset();
    }
    next_launch_ = 0;
    launched_early_ = 0;
    hooked_step_ = false;
    std::fill(ever_arrived_.begin(), ever_arrived_.end(), false);
  }
  std::fill(arrived_.begin(), arrived_.end(), false);
  for (auto& bucket : buckets_) bucket.waiting = int64_t(bucket.members.size());
  last_microbatch_ = micro + 1 == count;
  Bucket& last = buckets_.back();
  last.flat[last.flat.numel() - 1].fill_(local_count);
}

void GradientReducer::on_gradient(size_t index, const at::Tensor& grad) {
  hooked_step_ = true;
  const Place& place = places_[index];
  Bucket& bucket = buckets_[place.bucket];
  if (bucket.launched) return;  // a second backward after the launch: not ours to mix in
  bucket.flat.narrow(0, place.offset, grad.numel()).add_(grad.reshape({-1}));
  ever_arrived_[index] = true;
  if (arrived_[index]) return;
  arrived_[index] = true;
  if (--bucket.waiting == 0 && last_microbatch_) launch_ready();
}

void GradientReducer::launch(Bucket& bucket) {
  bucket.io = {bucket.flat};
  bucket.work = group_.allreduce_sum(bucket.io);
  bucket.launched = true;
}

void GradientReducer::launch_ready() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].waiting == 0) {
    launch(buckets_[next_launch_++]);
    ++launched_early_;
  }
}

double GradientReducer::finish() {
  if (!hooked_step_) {
    // No hooks ran (overlap off): take the gradients from .grad.
    for (auto& bucket : buckets_)
      for (size_t i : bucket.members) {
        const at::Tensor& grad = params_[i].second.grad();
        if (!grad.defined()) continue;
        bucket.flat.narrow(0, places_[i].offset, grad.numel()).copy_(grad.reshape({-1}));
        ever_arrived_[i] = true;
      }
    launched_early_ = 0;
  }
  std::string unused;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ever_arrived_[i]) unused += (unused.empty() ? "" : ", ") + params_[i].first;
  if (!unused.empty() && !reported_unused_) {
    reported_unused_ = true;
    spdlog::warn("Decision: unused_parameters = {} (no gradient arrived this step; they count as "
                 "zero in the all-reduce, so no rank waits for them)", unused);
  }
  for (size_t b = 0; b < next_launch_; ++b) {  // finished before backward ended: hidden
    const int64_t bytes = buckets_[b].flat.numel() * int64_t(buckets_[b].flat.element_size());
    if (buckets_[b].work->done()) bytes_hidden_ += bytes;
  }
  while (next_launch_ < buckets_.size()) launch(buckets_[next_launch_++]);
  for (auto& bucket : buckets_) {
    bytes_reduced_ += bucket.flat.numel() * int64_t(bucket.flat.element_size());
    bucket.work->wait();
  }

  const Bucket& last = buckets_.back();
  const double global_count = last.flat[last.flat.numel() - 1].item<double>();
  const double scale = global_count > 0 ? 1.0 / global_count : 1.0;
  for (Bucket& bucket : buckets_)
    for (size_t i : bucket.members) {
      at::Tensor& p = params_[i].second;
      at::Tensor slot = bucket.flat.narrow(0, places_[i].offset, p.numel()).view(p.sizes());
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      p.mutable_grad().copy_(slot).mul_(scale);
    }
  return global_count;
}

double GradientReducer::allreduce_mean(double local_count) {
  begin_microbatch(0, 1, local_count);
  hooked_step_ = false;
  return finish();
}

int64_t GradientReducer::nonfinite_count() const {
  int64_t count = 0;
  for (const auto& bucket : buckets_) {
    if (std::isfinite(bucket.flat.sum().item<double>())) continue;  // the common case: one pass
    count += (~bucket.flat.isfinite()).sum().item<int64_t>();
  }
  return count;
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

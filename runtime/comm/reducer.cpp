#include "runtime/comm/reducer.h"

#include <cmath>

#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include "runtime/base/errors.h"

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
  places_.resize(params_.size());
  int64_t offset = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].start = offset;
    for (size_t i : buckets_[b].members) {
      places_[i] = {b, offset};
      offset += params_[i].second.numel();
    }
    buckets_[b].length = offset - buckets_[b].start;
  }
  const auto tensor_options = params_.front().second.options().requires_grad(false);
  gradients_ = torch::zeros({offset + kTailSlots}, tensor_options);
  parameters_ = torch::empty({offset}, tensor_options);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& p = params_[i].second;
      at::Tensor home = parameters_.narrow(0, places_[i].offset, p.numel()).view(p.sizes());
      home.copy_(p);
      p.set_data(home);  // same tensor for the model, new memory
    }
  }
  bind_gradients(/*keep_values=*/true);
  arrived_.assign(params_.size(), false);
  ever_arrived_.assign(params_.size(), false);
  // After the accumulator has added this microbatch's gradient into the
  // bucket (a tensor hook would run before it, too early to send).
  for (size_t i = 0; i < params_.size(); ++i) {
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(params_[i].second));
    hook_keys_.push_back(accumulators_.back()->add_post_hook(
        std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, i](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list&) {
              on_gradient(i);
              return outputs;
            })));
  }
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < hook_keys_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

at::Tensor GradientReducer::slot_of(size_t index) const {
  const at::Tensor& p = params_[index].second;
  return gradients_.narrow(0, places_[index].offset, p.numel()).view(p.sizes());
}

at::Tensor GradientReducer::tail_slot(int64_t slot) const {
  return gradients_[gradients_.numel() - kTailSlots + slot];
}

void GradientReducer::bind_gradients(bool keep_values) {
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i].second;
    const at::Tensor& grad = p.grad();
    at::Tensor slot = slot_of(i);
    if (grad.defined() && grad.data_ptr() == slot.data_ptr()) continue;
    if (keep_values) {
      if (grad.defined()) slot.copy_(grad);
      else slot.zero_();
    }
    p.mutable_grad() = slot;
  }
}

void GradientReducer::start_step(bool zero_gradients) {
  if (zero_gradients) gradients_.zero_();
  for (auto& bucket : buckets_) {
    bucket.launched = false;
    bucket.work.reset();
  }
  io_.clear();
  bind_gradients(/*keep_values=*/!zero_gradients);
  tail_slot(kRanksMissingGradients).fill_(0.0);
  tail_slot(kRanksAskingToStop).fill_(0.0);
  tail_slot(kLossSum).fill_(0.0);
  tail_slot(kSamples).fill_(0.0);
  stop_agreed_ = false;
  next_launch_ = 0;
  launched_early_ = 0;
  collectives_ = 0;
  late_gradient_.clear();
  std::fill(ever_arrived_.begin(), ever_arrived_.end(), false);
}

void GradientReducer::begin_microbatch(int64_t micro, int64_t count, double local_count,
                                       double local_loss_sum, double local_samples) {
  if (micro == 0) start_step(/*zero_gradients=*/true);
  std::fill(arrived_.begin(), arrived_.end(), false);
  for (auto& bucket : buckets_) bucket.waiting = int64_t(bucket.members.size());
  last_microbatch_ = micro + 1 == count;
  tail_slot(kValidCount).fill_(local_count);
  tail_slot(kLossSum).fill_(local_loss_sum);
  tail_slot(kSamples).fill_(local_samples);
  if (asking_to_stop_) tail_slot(kRanksAskingToStop).fill_(1.0);
}

void GradientReducer::on_gradient(size_t index) {
  Bucket& bucket = buckets_[places_[index].bucket];
  if (bucket.launched && late_gradient_.empty()) late_gradient_ = params_[index].first;
  ever_arrived_[index] = true;
  if (arrived_[index]) return;
  arrived_[index] = true;
  if (--bucket.waiting == 0 && last_microbatch_ && options_.overlap) launch_ready();
}

void GradientReducer::launch(size_t first, size_t end) {
  const int64_t start = buckets_[first].start;
  const int64_t stop = end == buckets_.size() ? gradients_.numel()  // with the tail slots
                                              : buckets_[end - 1].start + buckets_[end - 1].length;
  io_.push_back(gradients_.narrow(0, start, stop - start));
  std::vector<at::Tensor> span{io_.back()};
  PendingCollective work = group_.allreduce_sum(span);
  for (size_t b = first; b < end; ++b) {
    buckets_[b].work = work;
    buckets_[b].launched = true;
  }
  ++collectives_;
  next_launch_ = end;
}

void GradientReducer::launch_ready() {
  // One all-reduce per bucket: which buckets are ready together depends on
  // this rank's graph, and every rank must issue the same collectives.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].waiting == 0) {
    launch(next_launch_, next_launch_ + 1);
    ++launched_early_;
  }
}

std::string GradientReducer::missing_gradients() const {
  std::string missing;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ever_arrived_[i]) missing += (missing.empty() ? "" : ", ") + params_[i].first;
  return missing;
}

double GradientReducer::finish() {
  const std::string missing = missing_gradients();
  // The last bucket can only have started during backward if every
  // gradient arrived (buckets start in order), so the flag is still unsent.
  if (!missing.empty()) tail_slot(kRanksMissingGradients).fill_(1.0);
  const int64_t element = int64_t(gradients_.element_size());
  for (size_t b = 0; b < next_launch_; ++b)  // finished before backward ended: hidden
    if (buckets_[b].work->done()) bytes_hidden_ += buckets_[b].length * element;
  if (!options_.overlap) {
    launch(0, buckets_.size());  // nothing started during backward on any rank: all as one
  } else {
    while (next_launch_ < buckets_.size()) launch(next_launch_, next_launch_ + 1);
  }
  for (auto& bucket : buckets_) {
    bytes_reduced_ += bucket.length * element;
    bucket.work->wait();
  }
  // The counts that rode along, read in one copy (one wait, on a GPU).
  const at::Tensor tail = gradients_.narrow(0, gradients_.numel() - kTailSlots, kTailSlots).to(at::kDouble).cpu();
  const double* counts = tail.data_ptr<double>();
  const double global_count = counts[kValidCount];
  global_loss_sum_ = counts[kLossSum];
  global_samples_ = counts[kSamples];
  const auto ranks_missing = int64_t(counts[kRanksMissingGradients]);
  stop_agreed_ = counts[kRanksAskingToStop] > 0.5;
  asking_to_stop_ = false;

  if (!late_gradient_.empty())
    throw RunError("the gradient of " + late_gradient_ + " was accumulated after its bucket's " +
                   "all-reduce had started: backward ran twice in one microbatch (one backward "
                   "per microbatch; use train.accum_steps for more)");
  if (ranks_missing > 0 && options_.error_on_unused)
    throw RunError(std::to_string(ranks_missing) + " of " + std::to_string(group_.size()) +
                   " ranks got no gradient for some parameters in this step (rank " +
                   std::to_string(group_.rank()) + ": " + (missing.empty() ? "none" : missing) +
                   "). A forward that skips parameters needs comm.unused_parameters = \"zero\" "
                   "(they then count as zero gradients); otherwise check the model's forward");
  if (!missing.empty() && !reported_unused_) {
    reported_unused_ = true;
    spdlog::warn("Decision: unused_parameters = {} (no gradient arrived this step; "
                 "comm.unused_parameters = \"zero\": they count as zero in the all-reduce)",
                 missing);
  }
  const double scale = global_count > 0 ? 1.0 / global_count : 1.0;
  gradients_.mul_(scale);  // the mean, in place in every .grad
  return global_count;
}

double GradientReducer::allreduce_mean(double local_count) {
  start_step(/*zero_gradients=*/false);  // .grad as it is; an undefined one is zeros
  std::fill(arrived_.begin(), arrived_.end(), true);
  std::fill(ever_arrived_.begin(), ever_arrived_.end(), true);
  last_microbatch_ = true;
  tail_slot(kValidCount).fill_(local_count);
  return finish();
}

int64_t GradientReducer::nonfinite_count() const {
  at::Tensor values = gradients_.narrow(0, 0, parameters_.numel());
  if (std::isfinite(values.sum().item<double>())) return 0;  // the common case: one pass
  return (~values.isfinite()).sum().item<int64_t>();
}

std::pair<at::Tensor, at::Tensor> GradientReducer::flat() const {
  return {parameters_, gradients_.narrow(0, 0, parameters_.numel())};
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

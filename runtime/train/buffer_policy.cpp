#include "runtime/train/buffer_policy.h"

#include <map>

#include <torch/torch.h>

#include "runtime/comm/exact_sum.h"

namespace lockstep {

BufferPolicy::BufferPolicy(const std::string& policy, const std::string& summation, NamedTensors buffers,
                           CollectiveGroup& group)
    : asked_(policy),
      summation_(summation),
      policy_(policy != "auto" ? policy : summation == "exact" ? "mean" : "broadcast"),
      buffers_(std::move(buffers)),
      group_(group) {}

void BufferPolicy::begin_microbatch(int64_t micro) {
  if (policy_ != "mean" || buffers_.empty()) return;
  torch::NoGradGuard no_grad;
  if (micro == 0) {
    step_start_.clear();
    changes_.clear();
    for (const auto& [name, tensor] : buffers_) step_start_.push_back(tensor.clone());
    return;
  }
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].second.copy_(step_start_[i]);
}

void BufferPolicy::end_microbatch() {
  if (policy_ != "mean" || buffers_.empty()) return;
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> flat;
  for (size_t i = 0; i < buffers_.size(); ++i)
    flat.push_back(buffers_[i].second.sub(step_start_[i]).to(at::kDouble).reshape({-1}));
  changes_.push_back(torch::cat(flat));
}

void BufferPolicy::aside(const std::function<void()>& compute) {
  std::vector<at::Tensor> now;
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, tensor] : buffers_) now.push_back(tensor.clone());
    if (policy_ == "mean" && step_start_.size() == buffers_.size())
      for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].second.copy_(step_start_[i]);
  }
  compute();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].second.copy_(now[i]);
}

void BufferPolicy::abandon_step() {
  if (step_start_.empty()) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].second.copy_(step_start_[i]);
  step_start_.clear();
  changes_.clear();
}

void BufferPolicy::sync(int64_t total_microbatches) {
  if (policy_ == "mean") return apply_mean_change(total_microbatches);
  if (!active() || group_.size() == 1) return;
  broadcast_all();
}

void BufferPolicy::apply_mean_change(int64_t total_microbatches) {
  if (buffers_.empty() || step_start_.empty()) return;
  torch::NoGradGuard no_grad;
  int64_t columns = 0;
  for (const auto& start : step_start_) columns += start.numel();
  const at::Tensor rows = changes_.empty() ? torch::zeros({0, columns}, torch::kDouble) : torch::stack(changes_);
  const std::vector<double> sums =
      exact_column_sums(group_, rows, columns, total_microbatches, buffers_.front().second.device());
  at::Tensor mean = torch::tensor(sums, torch::kDouble).div_(double(total_microbatches));
  int64_t offset = 0;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    at::Tensor& buffer = buffers_[i].second;
    const at::Tensor change = mean.narrow(0, offset, buffer.numel()).view(buffer.sizes());
    offset += buffer.numel();
    // start + mean change, rounded once to the buffer's dtype (counters: to the nearest integer).
    at::Tensor value = step_start_[i].to(at::kCPU).to(at::kDouble).add(change);
    if (!at::isFloatingType(buffer.scalar_type())) value = value.round();
    buffer.copy_(value.to(buffer.scalar_type()));
  }
  step_start_.clear();
  changes_.clear();
}

std::vector<at::Tensor> BufferPolicy::take_rank_zero_buffers() {
  std::vector<at::Tensor> own;
  for (const auto& [name, tensor] : buffers_) own.push_back(tensor.clone());
  const std::string policy = policy_;
  policy_ = "broadcast";
  broadcast_all();
  policy_ = policy;
  return own;
}

void BufferPolicy::restore(const std::vector<at::Tensor>& own) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < own.size(); ++i) buffers_[i].second.copy_(own[i]);
}

void BufferPolicy::broadcast_all() {
  torch::NoGradGuard no_grad;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
  for (const auto& [name, tensor] : buffers_) by_type[tensor.scalar_type()].push_back(tensor);
  for (auto& [type, tensors] : by_type) {
    std::vector<at::Tensor> flat_views;
    for (const auto& t : tensors) flat_views.push_back(t.reshape({-1}));
    at::Tensor packed = torch::cat(flat_views);
    if (policy_ == "average" && at::isFloatingType(type)) {
      std::vector<at::Tensor> io{packed};
      group_.allreduce_sum(io).wait();
      packed.div_(double(group_.size()));
    } else {
      group_.broadcast(packed, 0);
    }
    int64_t offset = 0;
    for (auto& t : tensors) {
      t.copy_(packed.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }
}

std::string BufferPolicy::value() const {
  if (buffers_.empty()) return "none to share";
  if (policy_ == "mean") return "mean of the microbatches' changes (" + std::to_string(buffers_.size()) + " buffers)";
  return policy_ + " (" + std::to_string(buffers_.size()) + " buffers)";
}

std::string BufferPolicy::reason() const {
  if (buffers_.empty()) return "the model has no buffers";
  const std::string chosen =
      asked_ == "auto" ? "comm.buffers = auto: " + policy_ + " with comm.summation = " + summation_ + "; " : "";
  const std::string tie = ties_bits_to_world_size()
                              ? "; with comm.buffers = " + policy_ + " the buffers, and through them the bits, "
                                "depend on the world size (mean keeps them independent of it)"
                              : "";
  return chosen + rule() + tie;
}

std::string BufferPolicy::rule() const {
  if (policy_ == "mean")
    return "comm.buffers = mean: every microbatch's forward starts from the step's buffers and the "
           "step applies the mean of the microbatches' changes, summed exactly over all of them: the "
           "same buffers at any world size (a running mean moves as after one forward over the "
           "global batch)";
  if (policy_ == "broadcast")
    return "comm.buffers = broadcast: rank 0's buffers go to every rank after each step, as "
           "PyTorch DDP sends them before each forward; every rank evaluates and saves the same";
  if (policy_ == "average")
    return "comm.buffers = average: floating buffers averaged over ranks after each step, integer "
           "ones taken from rank 0";
  return "comm.buffers = local: each rank keeps the running statistics of its own batches; they "
         "differ across ranks and the audit checks parameters only; evaluation uses rank 0's, "
         "the ones model-final.pt holds";
}

}  // namespace lockstep

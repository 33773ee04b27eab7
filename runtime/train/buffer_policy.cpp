#include "runtime/train/buffer_policy.h"

#include <map>

#include <torch/torch.h>

namespace lockstep {

BufferPolicy::BufferPolicy(std::string policy, NamedTensors buffers, CollectiveGroup& group)
    : policy_(std::move(policy)), buffers_(std::move(buffers)), group_(group) {}

void BufferPolicy::sync() {
  if (!active() || group_.size() == 1) return;
  broadcast_all();
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
  return policy_ + " (" + std::to_string(buffers_.size()) + " buffers)";
}

std::string BufferPolicy::reason() const {
  if (buffers_.empty()) return "the model has no buffers";
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

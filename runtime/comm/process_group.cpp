#include "runtime/comm/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>
#ifdef USE_C10D_NCCL
#include <cstdlib>
#include <cstring>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace lockstep {

struct PendingCollective::Impl {
  c10::intrusive_ptr<c10d::Work> work;
};

void PendingCollective::wait() {
  if (impl_) impl_->work->wait();
}

bool PendingCollective::done() const { return !impl_ || impl_->work->isCompleted(); }

struct CollectiveGroup::Impl {
#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::Backend> group;  // 2.x: ProcessGroupGloo is a Backend
#else
  c10::intrusive_ptr<c10d::ProcessGroup> group;
#endif
};

StorePtr open_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                        std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = is_server;
  options.numWorkers = static_cast<std::size_t>(world_size);
  options.waitWorkers = false;
  options.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

int store_port(const StorePtr& store) {
  auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get());
  return tcp ? tcp->getPort() : -1;
}

StorePtr prefixed(const std::string& prefix, const StorePtr& store) {
  return c10::make_intrusive<c10d::PrefixStore>(prefix, store);
}

CollectiveGroup::CollectiveGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CollectiveGroup::~CollectiveGroup() = default;

std::unique_ptr<CollectiveGroup> CollectiveGroup::gloo(const StorePtr& store, int rank, int size,
                                                       std::chrono::milliseconds timeout,
                                                       const std::vector<std::string>& addresses) {
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = timeout;
  // Never createDefaultDevice(): it binds whatever the host name resolves
  // to, loopback when it does not resolve, and peers on other hosts fail.
  for (const auto& address : addresses)
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(address));
  if (options->devices.empty())
    throw std::invalid_argument("CollectiveGroup::gloo: no address to bind");
  auto impl = std::make_unique<Impl>();
  impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  return std::unique_ptr<CollectiveGroup>(new CollectiveGroup(std::move(impl)));
}

std::unique_ptr<CollectiveGroup> CollectiveGroup::nccl(const StorePtr& store, int rank, int size,
                                                       std::chrono::milliseconds timeout, int device_index,
                                                       bool* blocking_wait) {
#ifdef USE_C10D_NCCL
  // Read when the group is made: wait() then blocks the host until the
  // collective is done or its timeout passed, and throws on this rank.
  const char* user = std::getenv("TORCH_NCCL_BLOCKING_WAIT");
  if (!user) ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 0);
  const char* now = std::getenv("TORCH_NCCL_BLOCKING_WAIT");
  if (blocking_wait) *blocking_wait = now && std::strcmp(now, "0") != 0;
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  group->setBoundDeviceId(c10::Device(c10::kCUDA, c10::DeviceIndex(device_index)));
  auto impl = std::make_unique<Impl>();
  impl->group = group;
  return std::unique_ptr<CollectiveGroup>(new CollectiveGroup(std::move(impl)));
#else
  (void)store, (void)rank, (void)size, (void)timeout, (void)device_index, (void)blocking_wait;
  throw std::logic_error("CollectiveGroup::nccl: this lockstep is built without NCCL");
#endif
}

int CollectiveGroup::rank() const { return impl_->group->getRank(); }
int CollectiveGroup::size() const { return impl_->group->getSize(); }

namespace {

template <typename Group>  // c10d's Backend (2.x) or ProcessGroup (1.13)
PendingCollective allreduce_with(Group& group, std::vector<at::Tensor>& tensors, c10d::ReduceOp op) {
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  auto impl = std::make_shared<PendingCollective::Impl>();
  impl->work = group.allreduce(tensors, options);
  return PendingCollective(std::move(impl));
}

}  // namespace

PendingCollective CollectiveGroup::allreduce_sum(std::vector<at::Tensor>& tensors) {
  return allreduce_with(*impl_->group, tensors, c10d::ReduceOp::SUM);
}

PendingCollective CollectiveGroup::allreduce_max(std::vector<at::Tensor>& tensors) {
  return allreduce_with(*impl_->group, tensors, c10d::ReduceOp::MAX);
}

PendingCollective CollectiveGroup::allgather_async(const at::Tensor& input,
                                                   std::vector<at::Tensor>& outputs) {
  std::vector<at::Tensor> inputs{input};
  std::vector<std::vector<at::Tensor>> slots(1);
  for (int r = 0; r < size(); ++r) slots[0].push_back(at::empty_like(input));
  outputs = slots[0];  // the same tensors: filled in place
  auto impl = std::make_shared<PendingCollective::Impl>();
  impl->work = impl_->group->allgather(slots, inputs);
  return PendingCollective(std::move(impl));
}

std::vector<at::Tensor> CollectiveGroup::allgather(const at::Tensor& input) {
  std::vector<at::Tensor> inputs{input};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(input));
  impl_->group->allgather(outputs, inputs)->wait();
  return outputs[0];
}

void CollectiveGroup::broadcast(at::Tensor& tensor, int root) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  impl_->group->broadcast(tensors, options)->wait();
}

}  // namespace lockstep

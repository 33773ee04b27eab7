#pragma once
// A c10d process group and the rendezvous store under it. This pair of
// files is the only place that touches LibTorch's ProcessGroup API
// (LibTorch 1.13: c10d::ProcessGroup; 2.x: c10d::Backend), so moving to a
// newer LibTorch changes this file alone.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace lockstep {

using StorePtr = c10::intrusive_ptr<c10d::Store>;

// Opens a TCPStore. The server (is_server) listens on `port` (0 = any free
// port; see store_port) and the client connects to host:port. `timeout`
// bounds connecting and every blocking get/wait on the store.
StorePtr open_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                        std::chrono::milliseconds timeout);
// The port a TCPStore really listens on (after asking for port 0).
int store_port(const StorePtr& store);
// A view of `store` with every key under `prefix`.
StorePtr prefixed(const std::string& prefix, const StorePtr& store);

// An all-reduce, all-gather or broadcast in flight. wait() returns when it
// is done, or rethrows the backend's failure (a timeout among them).
class PendingCollective {
 public:
  struct Impl;
  explicit PendingCollective(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  void wait();
  // True once it has finished (without waiting).
  bool done() const;

 private:
  std::shared_ptr<Impl> impl_;
};

// A group of ranks that run collectives together. Every call must be made
// by every rank in the same order. Not thread-safe.
class CollectiveGroup {
 public:
  struct Impl;
  // A Gloo group on `store`. `timeout` bounds every collective; connecting
  // is bounded by the store's own timeout. `addresses` are the local
  // addresses Gloo binds, one device each (runtime/comm/network.h chooses them).
  static std::unique_ptr<CollectiveGroup> gloo(const StorePtr& store, int rank, int size,
                                               std::chrono::milliseconds timeout,
                                               const std::vector<std::string>& addresses);
  // An NCCL group on `store` for this process's GPU `device_index` (CUDA
  // tensors only). `timeout` bounds every collective: with blocking waits
  // (TORCH_NCCL_BLOCKING_WAIT=1, set unless the environment says otherwise)
  // a collective that does not finish in time throws from wait() on this
  // rank rather than hanging or aborting the process. `blocking_wait` says
  // which happened. Throws std::logic_error in a build without NCCL.
  static std::unique_ptr<CollectiveGroup> nccl(const StorePtr& store, int rank, int size,
                                               std::chrono::milliseconds timeout, int device_index,
                                               bool* blocking_wait);
  ~CollectiveGroup();

  int rank() const;
  int size() const;
  // In-place sum over ranks, started now.
  PendingCollective allreduce_sum(std::vector<at::Tensor>& tensors);
  // In-place maximum over ranks, started now (a NaN's fate depends on the backend).
  PendingCollective allreduce_max(std::vector<at::Tensor>& tensors);
  // Gathers `input` (same shape everywhere) from every rank; blocking.
  std::vector<at::Tensor> allgather(const at::Tensor& input);
  // The same, started now: `outputs` (one per rank) are valid after wait().
  PendingCollective allgather_async(const at::Tensor& input, std::vector<at::Tensor>& outputs);
  // Overwrites `tensor` with rank `root`'s; blocking.
  void broadcast(at::Tensor& tensor, int root);

 private:
  explicit CollectiveGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep

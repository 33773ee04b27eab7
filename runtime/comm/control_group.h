#pragma once
// The control group: barriers and agreement checks, always on Gloo, apart
// from the data group that carries gradients, with its own explicit timeout
// (comm.barrier_timeout_s).
//
// Barrier protocol, on the rendezvous store:
//   1. rank r sets barrier/<name>/<n>/<r>, where n counts this rank's
//      barriers of that name;
//   2. it polls until every rank's key of the same <name>/<n> exists;
//   3. past the timeout it lists the ranks whose keys are missing and throws.
// A Gloo barrier cannot name who is missing; the store can.
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"

namespace lockstep {

class ControlGroup {
 public:
  // `store` is the job's (un-prefixed) store; `group` a Gloo group whose
  // collective timeout equals `timeout`.
  ControlGroup(StorePtr store, std::unique_ptr<CollectiveGroup> group,
               std::chrono::milliseconds timeout);

  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Returns when every rank has arrived at the barrier `name`. Throws
  // BarrierTimeout naming the missing ranks once `timeout` has passed; the
  // data group's timeout plays no part. Not thread-safe: one caller.
  void barrier(const std::string& name);

  // Barrier `name`, then an all-gather of `values` (same length on every
  // rank). Returns one vector per rank.
  std::vector<std::vector<int64_t>> allgather(const std::string& name,
                                              const std::vector<int64_t>& values);

  // Each rank publishes `value` under `name`; returns every rank's value.
  // For small strings (host names, run ids), through the store.
  std::vector<std::string> exchange(const std::string& name, const std::string& value);

  CollectiveGroup& collectives() { return *group_; }

 private:
  StorePtr store_;
  std::unique_ptr<CollectiveGroup> group_;
  std::chrono::milliseconds timeout_;
  std::map<std::string, int> rounds_;  // barriers/exchanges done per name
};

}  // namespace lockstep

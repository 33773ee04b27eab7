#include "runtime/comm/control_group.h"

#include <thread>

#include <torch/torch.h>

#include "runtime/base/errors.h"
#include "runtime/run/generation.h"

namespace lockstep {
namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

}  // namespace

ControlGroup::ControlGroup(StorePtr store, std::unique_ptr<CollectiveGroup> group,
                           std::chrono::milliseconds timeout)
    : store_(std::move(store)), group_(std::move(group)), timeout_(timeout) {}

void ControlGroup::barrier(const std::string& name) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const std::string prefix =
      "lockstep/barrier/" + name + "/" + std::to_string(rounds_[name]++) + "/";
  store_->set(prefix + std::to_string(rank()), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(prefix + std::to_string(r));
  auto pause = std::chrono::milliseconds(1);
  while (!store_->check(keys)) {
    throw_if_generation_ended("control-group barrier '" + name + "' on rank " + std::to_string(rank()));
    if (Clock::now() - start >= timeout_) {
      std::vector<int> missing;
      for (int r = 0; r < size(); ++r)
        if (!store_->check({keys[r]})) missing.push_back(r);
      if (missing.empty()) return;  // the last rank arrived just now
      double waited = std::chrono::duration<double>(Clock::now() - start).count();
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.2f", waited);
      throw BarrierTimeout("control-group barrier '" + name + "' timed out on rank " +
                               std::to_string(rank()) + " after " + seconds + " s: rank" +
                               (missing.size() > 1 ? "s " : " ") + rank_list(missing) +
                               " did not arrive (comm.barrier_timeout_s = " +
                               std::to_string(timeout_.count() / 1000.0).substr(0, 6) + ")",
                           missing);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

std::vector<std::vector<int64_t>> ControlGroup::allgather(const std::string& name,
                                                          const std::vector<int64_t>& values) {
  barrier(name);
  auto local = torch::tensor(values, torch::kInt64);
  std::vector<std::vector<int64_t>> out;
  for (const auto& t : group_->allgather(local))
    out.emplace_back(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  return out;
}

std::vector<std::string> ControlGroup::exchange(const std::string& name,
                                                const std::string& value) {
  const std::string prefix =
      "lockstep/exchange/" + name + "/" + std::to_string(rounds_["exchange/" + name]++) + "/";
  store_->set(prefix + std::to_string(rank()), std::vector<uint8_t>(value.begin(), value.end()));
  barrier("exchange/" + name);
  std::vector<std::string> out;
  for (int r = 0; r < size(); ++r) {
    auto bytes = store_->get(prefix + std::to_string(r));
    out.emplace_back(bytes.begin(), bytes.end());
  }
  return out;
}

}  // namespace lockstep

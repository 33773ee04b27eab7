#include "runtime/comm/control_group.h"

#include <atomic>
#include <chrono>

#include <gtest/gtest.h>

#include "runtime/base/errors.h"
#include "support/thread_world.h"

namespace lockstep {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::unique_ptr<ControlGroup> make_control(const StorePtr& store, int rank, int world,
                                           milliseconds timeout) {
  return std::make_unique<ControlGroup>(
      store, CollectiveGroup::gloo(prefixed("control/", store), rank, world, timeout, {"127.0.0.1"}),
      timeout);
}

TEST(ControlGroup, BarrierTimeoutIsHonouredAndNamesTheMissingRank) {
  std::atomic<bool> done{false};
  double waited = 0;
  std::string message;
  std::vector<int> missing;
  testing::run_ranks(2, [&](int rank, StorePtr store) {
    auto control = make_control(store, rank, 2, seconds(2));
    // The data group's collective timeout is long: it must play no part.
    auto data = CollectiveGroup::gloo(prefixed("data/", store), rank, 2, seconds(60), {"127.0.0.1"});
    if (rank == 1) {  // held back: never reaches the barrier while rank 0 waits
      while (!done) std::this_thread::sleep_for(milliseconds(10));
      return;
    }
    auto start = std::chrono::steady_clock::now();
    try {
      control->barrier("start");
      ADD_FAILURE() << "barrier returned although rank 1 never arrived";
    } catch (const BarrierTimeout& e) {
      waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      message = e.what();
      missing = e.missing_ranks();
    }
    done = true;
  });
  EXPECT_GE(waited, 2.0);
  EXPECT_LE(waited, 4.0);
  EXPECT_EQ(missing, std::vector<int>{1});
  EXPECT_NE(message.find("rank 1 did not arrive"), std::string::npos) << message;
  EXPECT_NE(message.find("'start'"), std::string::npos) << message;
}

TEST(ControlGroup, BarriersAllgatherAndExchangeAgree) {
  std::vector<std::vector<std::vector<int64_t>>> gathered(3);
  std::vector<std::vector<std::string>> exchanged(3);
  testing::run_ranks(3, [&](int rank, StorePtr store) {
    auto control = make_control(store, rank, 3, seconds(20));
    for (int i = 0; i < 3; ++i) control->barrier("loop");  // repeated names are distinct rounds
    gathered[rank] = control->allgather("values", {rank, 10 * rank});
    exchanged[rank] = control->exchange("name", "r" + std::to_string(rank));
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(gathered[r], (std::vector<std::vector<int64_t>>{{0, 0}, {1, 10}, {2, 20}}));
    EXPECT_EQ(exchanged[r], (std::vector<std::string>{"r0", "r1", "r2"}));
  }
}

}  // namespace
}  // namespace lockstep

// The coordinator's rendezvous store: c10d's semantics (set, get that waits,
// add on decimal integers, compare-and-set), bounded waits, bounded sizes.
#include "coordinator/key_value_store.h"

#include <thread>

#include <gtest/gtest.h>

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(KeyValueStore, GetWaitsForASetAndGivesUpAtItsLimit) {
  KeyValueStore store;
  const auto start = Clock::now();
  EXPECT_FALSE(store.get("missing", 200ms).has_value());
  EXPECT_GE(Clock::now() - start, 190ms);

  std::thread writer([&] {
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(store.set("late", "value"), "");
  });
  auto value = store.get("late", 5000ms);
  writer.join();
  ASSERT_TRUE(value.has_value());
  EXPECT_EQ(*value, "value");
  EXPECT_TRUE(store.wait({"late"}, 0ms));
  EXPECT_FALSE(store.wait({"late", "missing"}, 0ms));
}

TEST(KeyValueStore, AddAndCompareSetFollowTcpStore) {
  KeyValueStore store;
  int64_t result = 0;
  EXPECT_EQ(store.add("counter", 3, &result), "");
  EXPECT_EQ(result, 3);
  EXPECT_EQ(store.add("counter", -5, &result), "");
  EXPECT_EQ(result, -2);
  EXPECT_EQ(*store.get("counter", 0ms), "-2");
  store.set("text", "abc");
  EXPECT_NE(store.add("text", 1, &result).find("does not hold an integer"), std::string::npos);

  std::string now;
  store.compare_set("unset", "expected", "new", &now);
  EXPECT_EQ(now, "expected");  // nothing set: TCPStore answers with the expectation
  EXPECT_FALSE(store.get("unset", 0ms).has_value());
  store.compare_set("unset", "", "first", &now);
  EXPECT_EQ(now, "first");
  store.compare_set("unset", "wrong", "second", &now);
  EXPECT_EQ(now, "first");
  store.compare_set("unset", "first", "second", &now);
  EXPECT_EQ(now, "second");
  EXPECT_TRUE(store.remove("unset"));
  EXPECT_FALSE(store.remove("unset"));
  EXPECT_EQ(store.size(), 2);
}

TEST(KeyValueStore, SizesAreBoundedAndCloseWakesWaiters) {
  KeyValueStore store({/*max_key_bytes=*/8, /*max_value_bytes=*/16, /*max_total_bytes=*/30});
  EXPECT_NE(store.set("a-key-too-long", "v").find("store key of 14 bytes"), std::string::npos);
  EXPECT_NE(store.set("k", std::string(17, 'x')).find("at most 16"), std::string::npos);
  EXPECT_EQ(store.set("k1", std::string(16, 'x')), "");
  EXPECT_EQ(store.set("k1", std::string(16, 'y')), "");  // replacing frees what it replaces
  EXPECT_NE(store.set("k2", std::string(16, 'x')).find("full"), std::string::npos);

  std::thread closer([&] {
    std::this_thread::sleep_for(100ms);
    store.close();
  });
  const auto start = Clock::now();
  EXPECT_FALSE(store.get("never", 60000ms).has_value());
  EXPECT_LT(Clock::now() - start, 5000ms);
  closer.join();
}

}  // namespace
}  // namespace lockstep

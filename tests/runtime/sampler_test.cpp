#include "runtime/data/sampler.h"

#include <algorithm>
#include <set>

#include <gtest/gtest.h>

namespace lockstep {
namespace {

class SamplerWorlds : public ::testing::TestWithParam<int> {};

TEST_P(SamplerWorlds, ShardsAreDisjointAndCoverTheEpoch) {
  const int world = GetParam();
  const int64_t size = 1003;  // not a multiple of any world size tested
  std::multiset<int64_t> seen;
  for (int rank = 0; rank < world; ++rank) {
    DistributedSampler sampler(size, rank, world, 7);
    auto mine = sampler.indices(3);
    EXPECT_EQ(int64_t(mine.size()), (size + world - 1) / world);
    seen.insert(mine.begin(), mine.end());
  }
  std::set<int64_t> distinct(seen.begin(), seen.end());
  EXPECT_EQ(int64_t(distinct.size()), size);  // the union is the whole epoch
  // Only the padding repeats samples: exactly ceil(N/W)*W - N of them.
  EXPECT_EQ(int64_t(seen.size()) - size, (size + world - 1) / world * world - size);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SamplerWorlds, ::testing::Values(1, 2, 3, 4, 7));

TEST(Sampler, OrderDependsOnlyOnSeedAndEpoch) {
  EXPECT_EQ(DistributedSampler::permutation(500, 1, 0), DistributedSampler::permutation(500, 1, 0));
  EXPECT_NE(DistributedSampler::permutation(500, 1, 0), DistributedSampler::permutation(500, 1, 1));
  EXPECT_NE(DistributedSampler::permutation(500, 1, 0), DistributedSampler::permutation(500, 2, 0));
  auto perm = DistributedSampler::permutation(500, 9, 4);
  std::sort(perm.begin(), perm.end());
  for (int64_t i = 0; i < 500; ++i) ASSERT_EQ(perm[size_t(i)], i);
}

TEST(Sampler, GlobalBatchOfWRanksIsOneProcessBatchOfWTimesB) {
  const int64_t size = 640, batch = 8;
  const int world = 2;
  DistributedSampler single(size, 0, 1, 5);
  auto whole = single.indices(0);
  std::vector<std::vector<int64_t>> shards;
  for (int r = 0; r < world; ++r) shards.push_back(DistributedSampler(size, r, world, 5).indices(0));
  for (int64_t t = 0; t < size / (batch * world); ++t) {
    std::multiset<int64_t> global, reference;
    for (int r = 0; r < world; ++r)
      global.insert(shards[r].begin() + t * batch, shards[r].begin() + (t + 1) * batch);
    reference.insert(whole.begin() + t * batch * world, whole.begin() + (t + 1) * batch * world);
    ASSERT_EQ(global, reference) << "batch " << t;
  }
}

TEST(Sampler, RejectsImpossibleArguments) {
  EXPECT_THROW(DistributedSampler(10, 2, 2, 0), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(0, 0, 1, 0), std::invalid_argument);
}

}  // namespace
}  // namespace lockstep

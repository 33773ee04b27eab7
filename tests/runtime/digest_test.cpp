// Tensor digests: the host's xxh3 and the lanes a GPU computes where the
// tensor lives. The lanes are tensor operations, so they run here on the
// CPU exactly as on a GPU: equal bits give equal lanes, any changed bit,
// moved element, other length or other element size changes them, and the
// chunked sum gives the same lanes as one pass would.
#include <cstring>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/model/digest.h"

namespace lockstep {
namespace {

TEST(LaneDigest, EqualBitsEqualLanesAcrossCopiesAndLayouts) {
  torch::manual_seed(1);
  const at::Tensor a = torch::randn({257, 33});
  EXPECT_EQ(lane_digest(a), lane_digest(a.clone()));
  // A transposed view of the same values in another order is another tensor;
  // a contiguous copy of the view equals the view.
  const at::Tensor t = a.t();
  EXPECT_NE(lane_digest(t), lane_digest(a));
  EXPECT_EQ(lane_digest(t), lane_digest(t.contiguous()));
  EXPECT_EQ(kind_of_device_digest(a), "xxh3-128");
  EXPECT_EQ(device_digest(a), digest(a));  // on the CPU the audit keeps xxh3
}

TEST(LaneDigest, EveryFlippedBitOfOneElementChangesIt) {
  at::Tensor a = torch::randn({1000});
  const TensorDigest before = lane_digest(a);
  for (int bit = 0; bit < 32; ++bit) {
    at::Tensor b = a.clone();
    int32_t bits;
    float* value = b.data_ptr<float>() + 617;
    std::memcpy(&bits, value, 4);
    bits ^= int32_t(1u << bit);
    std::memcpy(value, &bits, 4);
    EXPECT_NE(lane_digest(b), before) << "bit " << bit;
  }
  // -0.0 and 0.0 compare equal as numbers but are other bits.
  EXPECT_NE(lane_digest(torch::tensor({0.0f})), lane_digest(torch::tensor({-0.0f})));
}

TEST(LaneDigest, SwappedElementsLengthAndElementSizeCount) {
  const at::Tensor a = torch::arange(10, torch::kFloat);
  at::Tensor swapped = a.clone();
  swapped[2] = a[7];
  swapped[7] = a[2];
  EXPECT_NE(lane_digest(swapped), lane_digest(a));
  EXPECT_NE(lane_digest(torch::zeros({5})), lane_digest(torch::zeros({6})));
  EXPECT_NE(lane_digest(torch::zeros({0})), lane_digest(torch::zeros({1})));
  EXPECT_NE(lane_digest(torch::zeros({4}, torch::kInt)), lane_digest(torch::zeros({2}, torch::kLong)));
  // Every element size a model holds: bf16, fp16, int64 counters, bool masks.
  for (auto dtype : {torch::kBFloat16, torch::kHalf, torch::kLong, torch::kBool, torch::kUInt8, torch::kDouble}) {
    const at::Tensor x = torch::ones({3}).to(dtype);
    at::Tensor y = x.clone();
    y[1] = 0;
    EXPECT_NE(lane_digest(x), lane_digest(y)) << dtype;
    EXPECT_EQ(lane_digest(x), lane_digest(x.clone())) << dtype;
  }
}

// More than one chunk (4 Mi elements each): the lanes of a tensor do not
// depend on where the chunks fall, since each element is mixed with its
// own position and the sums wrap exactly; a change in the second chunk counts.
TEST(LaneDigest, ChunksOfALargeTensor) {
  at::Tensor a = torch::rand({(int64_t(1) << 22) + 1000});
  const TensorDigest whole = lane_digest(a);
  EXPECT_EQ(whole, lane_digest(a.clone()));
  a[(int64_t(1) << 22) + 5] += 1.0f;
  EXPECT_NE(lane_digest(a), whole);
  EXPECT_NEAR(whole.sum, a.sum(at::kDouble).item<double>() - 1.0, 1e-3);
}

}  // namespace
}  // namespace lockstep

#include "optim/clip.h"

#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lockstep::optim {
namespace {

at::Tensor param(int64_t n) { return torch::zeros({n}, torch::requires_grad()); }

// Two bias parameters whose gradients are the same storage (an alias), and
// one ordinary weight. By hand: the norm counts the shared values once, and
// clipping multiplies them by max_norm / norm once, not twice.
TEST(ClipGradNorm, SharedStorageIsCountedAndScaledOnce) {
  auto weight = param(2), bias_a = param(2), bias_b = param(2);
  weight.mutable_grad() = torch::tensor({3.0f, 0.0f});
  auto shared = torch::tensor({0.0f, 4.0f});
  bias_a.mutable_grad() = shared;
  bias_b.mutable_grad() = shared;  // same storage, same view

  ClipResult r = clip_grad_norm({{"weight", weight}, {"a.bias", bias_a}, {"b.bias", bias_b}}, 1.0);
  const double norm = std::sqrt(3.0 * 3.0 + 4.0 * 4.0);  // 5, not sqrt(9 + 16 + 16)
  EXPECT_NEAR(r.total_norm, norm, 1e-6);
  EXPECT_TRUE(r.clipped);
  ASSERT_EQ(r.shared_storage.size(), 1u);
  EXPECT_EQ(r.shared_storage[0], (std::vector<std::string>{"a.bias", "b.bias"}));
  const double coefficient = 1.0 / (norm + 1e-6);
  EXPECT_NEAR(weight.grad()[0].item<double>(), 3.0 * coefficient, 1e-6);
  EXPECT_NEAR(shared[1].item<double>(), 4.0 * coefficient, 1e-6);  // scaled once
  EXPECT_NEAR(bias_b.grad()[1].item<double>(), 4.0 * coefficient, 1e-6);
}

// Two gradients that are different slices of one flat buffer: each element
// counts once and is scaled once; elements no gradient covers stay as they are.
TEST(ClipGradNorm, DisjointViewsOfOneBuffer) {
  auto flat = torch::tensor({1.0f, 2.0f, 2.0f, 100.0f});
  auto a = param(2), b = param(1);
  a.mutable_grad() = flat.narrow(0, 0, 2);
  b.mutable_grad() = flat.narrow(0, 2, 1);
  ClipResult r = clip_grad_norm({{"a", a}, {"b", b}}, 1.5);
  EXPECT_NEAR(r.total_norm, 3.0, 1e-6);
  EXPECT_TRUE(r.shared_storage.empty());  // one buffer, no element in two gradients
  const double c = 1.5 / (3.0 + 1e-6);
  EXPECT_NEAR(flat[0].item<double>(), 1.0 * c, 1e-6);
  EXPECT_NEAR(flat[2].item<double>(), 2.0 * c, 1e-6);
  EXPECT_EQ(flat[3].item<float>(), 100.0f);  // not a gradient: untouched
}

TEST(ClipGradNorm, MatchesLibTorchWithoutSharing) {
  torch::manual_seed(1);
  auto layer = torch::nn::Linear(8, 4);
  layer->forward(torch::randn({5, 8})).pow(2).sum().backward();
  std::vector<at::Tensor> reference;
  NamedTensors named;
  for (const auto& item : layer->named_parameters()) {
    reference.push_back(item.value().grad().clone());
    named.emplace_back(item.key(), item.value());
  }
  double expected_norm = 0;
  for (const auto& g : reference) expected_norm += g.pow(2).sum().item<double>();
  expected_norm = std::sqrt(expected_norm);
  ClipResult r = clip_grad_norm(named, 0.5);
  EXPECT_NEAR(r.total_norm, expected_norm, 1e-4);
  EXPECT_TRUE(r.shared_storage.empty());
  for (size_t i = 0; i < reference.size(); ++i)
    EXPECT_TRUE(named[i].second.grad().allclose(reference[i] * (0.5 / (expected_norm + 1e-6))));
}

TEST(ClipGradNorm, CountsNonFiniteAndDoesNotScale) {
  auto a = param(3);
  a.mutable_grad() = torch::tensor({1.0f, std::nanf(""), INFINITY});
  ClipResult r = clip_grad_norm({{"a", a}}, 1.0);
  EXPECT_EQ(r.nonfinite, 2);
  EXPECT_FALSE(r.clipped);
  EXPECT_EQ(a.grad()[0].item<float>(), 1.0f);
}

}  // namespace
}  // namespace lockstep::optim

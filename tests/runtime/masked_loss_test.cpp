#include "runtime/loss/masked_loss.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lockstep {
namespace {

TEST(MaskedLoss, EqualsTheLossOverValidTargetsOnly) {
  torch::manual_seed(0);
  auto logits = torch::randn({6, 10});
  auto labels = torch::tensor({3, -1, 7, -1, 0, 9}, torch::kInt64);
  MaskedLoss loss = masked_cross_entropy_sum(logits, labels);
  auto valid_rows = torch::tensor({0, 2, 4, 5}, torch::kInt64);
  auto reference = torch::nn::functional::cross_entropy(
      logits.index_select(0, valid_rows), labels.index_select(0, valid_rows),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  EXPECT_EQ(loss.valid, 4);
  EXPECT_EQ(loss.masked, 2);
  EXPECT_NEAR(loss.sum.item<double>(), reference.item<double>(), 1e-6);
  // Not the loss of treating -1 as a class: that would be argmax-ed into class 0 or fail.
  EXPECT_GT(std::abs(loss.sum.item<double>() / 4 -
                     torch::nn::functional::cross_entropy(logits, labels.clamp_min(0)).item<double>()),
            1e-4);
}

TEST(MaskedLoss, NanFloatTargetsAreMissing) {
  auto logits = torch::randn({3, 4});
  auto labels = torch::tensor({1.0, std::nan(""), 2.0});
  MaskedLoss loss = masked_cross_entropy_sum(logits, labels);
  EXPECT_EQ(loss.valid, 2);
  EXPECT_EQ(loss.masked, 1);
  EXPECT_TRUE(std::isfinite(loss.sum.item<double>()));
}

TEST(MaskedLoss, AllMissingGivesZeroGradient) {
  auto layer = torch::nn::Linear(4, 3);
  auto labels = torch::full({5}, -1, torch::kInt64);
  MaskedLoss loss = masked_cross_entropy_sum(layer->forward(torch::randn({5, 4})), labels);
  EXPECT_EQ(loss.valid, 0);
  loss.sum.backward();
  for (const auto& p : layer->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().abs().max().item<float>(), 0.0f);
  }
}

// Regression with NaN targets, by hand: outputs (1, 2, 3, 4) against
// targets (1.5, NaN, 2, NaN): squared errors 0.25 and 1 over 2 values;
// absolute errors 0.5 and 1. The gradient is zero where the target is missing.
TEST(MaskedLoss, MaskedMseAndL1EqualAHandComputation) {
  const double nan = std::nan("");
  auto output = torch::tensor({{1.0, 2.0}, {3.0, 4.0}}).requires_grad_();
  auto target = torch::tensor({{1.5, nan}, {2.0, nan}});
  MaskedLoss squared = masked_elementwise_sum(output, target, ElementLoss::kSquared);
  EXPECT_EQ(squared.valid, 2);
  EXPECT_EQ(squared.masked, 2);
  EXPECT_DOUBLE_EQ(squared.sum.item<double>(), 0.25 + 1.0);
  squared.sum.backward();
  auto grad = output.grad();
  EXPECT_DOUBLE_EQ(grad[0][0].item<double>(), 2 * (1.0 - 1.5));
  EXPECT_DOUBLE_EQ(grad[1][0].item<double>(), 2 * (3.0 - 2.0));
  EXPECT_EQ(grad[0][1].item<double>(), 0.0);
  EXPECT_EQ(grad[1][1].item<double>(), 0.0);
  EXPECT_FALSE(grad.isnan().any().item<bool>());
  MaskedLoss absolute = masked_elementwise_sum(output, target, ElementLoss::kAbsolute);
  EXPECT_DOUBLE_EQ(absolute.sum.item<double>(), 0.5 + 1.0);
}

TEST(MaskedLoss, AllMissingGivesZeroLossAndZeroGradient) {
  auto output = torch::randn({3, 2}).requires_grad_();
  auto target = torch::full({3, 2}, std::nan(""));
  for (auto kind : {ElementLoss::kSquared, ElementLoss::kAbsolute,
                    ElementLoss::kBinaryCrossEntropyWithLogits}) {
    MaskedLoss loss = masked_elementwise_sum(output, target, kind);
    EXPECT_EQ(loss.valid, 0);
    EXPECT_EQ(loss.sum.item<double>(), 0.0);
    loss.sum.backward();
    EXPECT_EQ(output.grad().abs().sum().item<double>(), 0.0);
    output.mutable_grad().zero_();
  }
}

TEST(MaskedLoss, BceWithLogitsMatchesLibTorchOnTheValidLabels) {
  torch::manual_seed(1);
  auto output = torch::randn({4, 3});
  auto target = torch::tensor({{1.0, 0.0, std::nan("")}, {0.0, 1.0, 1.0},
                               {std::nan(""), 0.0, 1.0}, {1.0, 1.0, 0.0}});
  MaskedLoss loss = masked_elementwise_sum(output, target, ElementLoss::kBinaryCrossEntropyWithLogits);
  auto valid = ~target.isnan();
  auto reference = torch::binary_cross_entropy_with_logits(output.masked_select(valid),
                                                           target.masked_select(valid), {}, {},
                                                           at::Reduction::Sum);
  EXPECT_EQ(loss.valid, 10);
  EXPECT_NEAR(loss.sum.item<double>(), reference.item<double>(), 1e-6);
}

}  // namespace
}  // namespace lockstep

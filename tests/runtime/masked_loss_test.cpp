#include "runtime/masked_loss.h"

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

}  // namespace
}  // namespace lockstep

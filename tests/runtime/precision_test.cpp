// The precision policy inside the model: a child listed in
// precision.fp32_modules runs in fp32 under bf16 autocast (its input cast
// before it runs), which a cast of its output afterwards cannot imitate;
// the overflow finder names the first child whose output is not finite;
// and the job-file forms of the precision keys.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/base/errors.h"
#include "runtime/model/models.h"

namespace lockstep {
namespace {

// body (identity-initialised) then head: Linear(1, 1) each.
class TwoLayers : public NativeModule {
 public:
  TwoLayers()
      : body_(register_module("body", torch::nn::Linear(1, 1))),
        head_(register_module("head", torch::nn::Linear(1, 1))) {
    torch::NoGradGuard no_grad;
    body_->weight.fill_(1.0);
    body_->bias.zero_();
    head_->weight.fill_(1.0 + std::ldexp(1.0, -10));  // fp32 holds it, bf16 (8 bits) does not
    head_->bias.zero_();
  }
  at::Tensor forward(at::Tensor x) override {
    x = run("body", [&](const at::Tensor& t) { return body_->forward(t); }, x);
    return run("head", [&](const at::Tensor& t) { return head_->forward(t); }, x);
  }
  torch::nn::Linear body_, head_;
};

const double kExact = 1.0 + std::ldexp(1.0, -10);  // 1.0009765625

TEST(Precision, Fp32HeadKeepsFp32ResolutionUnderBf16Autocast) {
  std::shared_ptr<Model> wrapped = wrap_native(std::make_shared<TwoLayers>(), "two_layers");
  Model& model = *wrapped;
  const at::Tensor one = torch::ones({1, 1});
  // fp32 throughout: the exact value.
  EXPECT_DOUBLE_EQ(forward_output(model, one, at::kFloat).item<double>(), kExact);
  // bf16 autocast, the head listed: its weight stays fp32, the value survives.
  model.set_fp32_modules({"head"});
  at::Tensor listed = forward_output(model, one, at::kBFloat16);
  EXPECT_EQ(listed.scalar_type(), at::kFloat);
  EXPECT_DOUBLE_EQ(listed.item<double>(), kExact);
  // Not listed, the output cast to fp32 afterwards: the step of bf16 is already
  // taken (1 + 2^-10 rounds to 1), a later cast cannot bring it back.
  model.set_fp32_modules({});
  at::Tensor cast_after = forward_output(model, one, at::kBFloat16);
  EXPECT_EQ(cast_after.scalar_type(), at::kFloat);
  EXPECT_DOUBLE_EQ(cast_after.item<double>(), 1.0);
}

TEST(Precision, UnknownFp32ModuleIsBadInputNamingTheModules) {
  TwoLayers model;
  try {
    model.set_fp32_modules({"haed"});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'haed'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("body, head"), std::string::npos) << e.what();
  }
}

TEST(Precision, OverflowFinderNamesTheFirstNonFiniteChild) {
  TwoLayers model;
  model.set_overflow_check(true);
  {
    torch::NoGradGuard no_grad;
    model.head_->bias.fill_(std::numeric_limits<float>::infinity());
  }
  model.forward(torch::ones({1, 1}));
  EXPECT_EQ(model.first_overflow(), "head");
  model.clear_overflow();
  {
    torch::NoGradGuard no_grad;
    model.body_->weight.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  model.forward(torch::ones({1, 1}));
  EXPECT_EQ(model.first_overflow(), "body");  // the first one, not the last
}

}  // namespace
}  // namespace lockstep

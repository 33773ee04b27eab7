#include "optim/optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lockstep::optim {
namespace {

TEST(Schedule, LinearWarmupThenCosineToZero) {
  ScheduleSpec spec{0.1, 10, 110, "cosine"};
  EXPECT_NEAR(scheduled_lr(spec, 0), 0.01, 1e-12);
  EXPECT_NEAR(scheduled_lr(spec, 9), 0.1, 1e-12);
  EXPECT_NEAR(scheduled_lr(spec, 10), 0.1, 1e-12);
  EXPECT_NEAR(scheduled_lr(spec, 60), 0.05, 1e-12);
  EXPECT_NEAR(scheduled_lr(spec, 110), 0.0, 1e-12);
  ScheduleSpec constant{0.1, 0, 100, "constant"};
  EXPECT_EQ(scheduled_lr(constant, 99), 0.1);
}

TEST(Optimizer, BuildsSgdAndAdamwAndSetsTheRate) {
  auto p = torch::ones({2}, torch::requires_grad());
  for (const char* name : {"sgd", "adamw"}) {
    auto optimizer = make_optimizer({p}, {name, 0.1, 0.9, 0.0});
    set_lr(*optimizer, 0.25);
    EXPECT_EQ(optimizer->param_groups()[0].options().get_lr(), 0.25) << name;
  }
  EXPECT_THROW(make_optimizer({p}, {"lion", 0.1, 0.9, 0.0}), std::invalid_argument);
}

}  // namespace
}  // namespace lockstep::optim

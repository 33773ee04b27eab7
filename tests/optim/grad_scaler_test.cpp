// The gradient scaler against a hand computation: skipped steps back off,
// growth_interval good steps in a row grow; its state round-trips; a short
// run does not start at 65536.
#include <gtest/gtest.h>

#include "optim/grad_scaler.h"

namespace lockstep::optim {
namespace {

TEST(GradScaler, SkipsAndScalesMatchTheHandComputation) {
  GradScaler scaler({1024.0, 2.0, 0.5, 4});
  // Steps 1..12, non-finite at 3 and 9.
  std::vector<double> expected = {1024, 1024, 512, 512, 512, 512, 1024, 1024, 512, 512, 512, 512};
  for (int step = 1; step <= 12; ++step) {
    const bool bad = step == 3 || step == 9;
    EXPECT_EQ(scaler.update(step, bad), !bad) << step;
    EXPECT_EQ(scaler.scale(), expected[size_t(step - 1)]) << step;
  }
  EXPECT_EQ(scaler.skipped(), 2);
  EXPECT_EQ(scaler.skipped_steps()[0]["step"], 3);
  EXPECT_EQ(scaler.skipped_steps()[0]["scale_after"], 512.0);
  EXPECT_EQ(scaler.skipped_steps()[1]["step"], 9);

  GradScaler restored({1.0, 2.0, 0.5, 4});
  restored.load(scaler.state());
  for (int step = 13; step <= 14; ++step) {
    EXPECT_EQ(restored.update(step, false), scaler.update(step, false));
    EXPECT_EQ(restored.scale(), scaler.scale());
  }
}

TEST(GradScaler, ShortRunsStartLowAndGrowSooner) {
  auto short_run = choose_scaler_options(100, 0, 0);
  EXPECT_EQ(short_run.options.init_scale, 256.0);  // 2^8: the floor
  EXPECT_EQ(short_run.options.growth_interval, 50);
  auto long_run = choose_scaler_options(1000000, 0, 0);
  EXPECT_EQ(long_run.options.init_scale, 65536.0);
  EXPECT_EQ(long_run.options.growth_interval, 2000);
  auto given = choose_scaler_options(100, 8.0, 3);
  EXPECT_EQ(given.options.init_scale, 8.0);
  EXPECT_EQ(given.options.growth_interval, 3);
  EXPECT_NE(short_run.reason.find("100-step run"), std::string::npos) << short_run.reason;
}

}  // namespace
}  // namespace lockstep::optim

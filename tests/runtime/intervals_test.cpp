// The 95% intervals evaluations report, against values worked out by hand
// from Wilson's formula and from Student's t tables.
#include "runtime/loss/intervals.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(Intervals, WilsonMatchesTheFormula) {
  const Interval small = wilson95(72, 256);
  EXPECT_NEAR(small.low, 0.229720915, 1e-9);
  EXPECT_NEAR(small.high, 0.339247022, 1e-9);
  const Interval large = wilson95(9170, 10000);
  EXPECT_NEAR(large.low, 0.911431348, 1e-9);
  EXPECT_NEAR(large.high, 0.922248398, 1e-9);
  EXPECT_LT(large.half_width(), small.half_width() / 10) << "more samples, a narrower interval";
  // At the edges Wilson's interval stays inside [0, 1] and is not empty.
  EXPECT_EQ(wilson95(0, 10).low, 0.0);
  EXPECT_NEAR(wilson95(0, 10).high, 0.277532800, 1e-9);
  EXPECT_NEAR(wilson95(10, 10).low, 0.722467200, 1e-9);
  EXPECT_LE(wilson95(10, 10).high, 1.0);
  EXPECT_EQ(wilson95(0, 0).low, 0.0);
  EXPECT_EQ(wilson95(0, 0).high, 1.0);
}

TEST(Intervals, StudentsTQuantilesAndAMeansInterval) {
  // Tables: 12.706 (df 1), 2.042 (df 30); beyond them within 1e-3 of
  // 2.0395 (31), 2.0003 (60), 1.9799 (120), 1.9623 (1000).
  EXPECT_DOUBLE_EQ(t_quantile95(1), 12.706);
  EXPECT_DOUBLE_EQ(t_quantile95(30), 2.042);
  EXPECT_NEAR(t_quantile95(31), 2.0395, 1e-3);
  EXPECT_NEAR(t_quantile95(60), 2.0003, 1e-3);
  EXPECT_NEAR(t_quantile95(120), 1.9799, 1e-3);
  EXPECT_NEAR(t_quantile95(1000), 1.9623, 1e-3);
  // 1, 2, 4, 7: mean 3.5, sample sd 2.6458, t(3) = 3.182.
  const Interval mean = t_interval95(14, 1 + 4 + 16 + 49, 4);
  EXPECT_NEAR(mean.low, -0.70939, 1e-4);
  EXPECT_NEAR(mean.high, 7.70939, 1e-4);
  EXPECT_EQ(t_interval95(5, 25, 1).low, 5.0) << "one value: no spread to estimate";
  EXPECT_EQ(t_interval95(5, 25, 1).high, 5.0);
  const Interval constant = t_interval95(30, 300, 3);  // 10, 10, 10
  EXPECT_NEAR(constant.low, 10.0, 1e-12);
  EXPECT_NEAR(constant.high, 10.0, 1e-12);
}

}  // namespace
}  // namespace lockstep

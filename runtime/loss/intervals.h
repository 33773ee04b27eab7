#pragma once
// 95% confidence intervals for the figures an evaluation reports, so that a
// metric from 200 samples does not look as solid as one from 10,000:
// Wilson's score interval for a share (accuracy), Student's t interval for
// a mean (a loss). Pure arithmetic: no torch, no state.
#include <cstdint>

namespace lockstep {

struct Interval {
  double low = 0, high = 0;
  double half_width() const { return (high - low) / 2; }
};

// Wilson's score interval at 95% for `hits` of `n` (n >= 1); [0, 1] for n = 0.
Interval wilson95(double hits, double n);

// Student's t interval at 95% for the mean of `n` values whose sum and sum
// of squares are given; the mean itself (zero width) for n < 2.
Interval t_interval95(double sum, double sum_of_squares, double n);

// The two-sided 95% quantile of Student's t with `df` degrees of freedom.
double t_quantile95(double df);

}  // namespace lockstep

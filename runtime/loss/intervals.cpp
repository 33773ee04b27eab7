#include "runtime/loss/intervals.h"

#include <algorithm>
#include <cmath>

namespace lockstep {

namespace {
constexpr double kZ = 1.959963984540054;  // the standard normal's 97.5% quantile
}

Interval wilson95(double hits, double n) {
  if (n <= 0) return {0, 1};
  const double p = std::clamp(hits / n, 0.0, 1.0);
  const double z2 = kZ * kZ;
  const double centre = (p + z2 / (2 * n)) / (1 + z2 / n);
  const double half = kZ * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n);
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

double t_quantile95(double df) {
  // Exact for small samples, where the expansion below is poor.
  static const double table[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                 2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                 2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (df < 1) return table[0];
  if (df <= 30) return table[int(df) - 1];
  // Cornish-Fisher expansion around the normal quantile (error < 1e-4 past 30).
  const double z = kZ, z3 = z * z * z, z5 = z3 * z * z;
  return z + (z3 + z) / (4 * df) + (5 * z5 + 16 * z3 + 3 * z) / (96 * df * df);
}

Interval t_interval95(double sum, double sum_of_squares, double n) {
  if (n < 1) return {0, 0};
  const double mean = sum / n;
  if (n < 2) return {mean, mean};
  const double variance = std::max(0.0, (sum_of_squares - n * mean * mean) / (n - 1));
  const double half = t_quantile95(n - 1) * std::sqrt(variance / n);
  return {mean - half, mean + half};
}

}  // namespace lockstep

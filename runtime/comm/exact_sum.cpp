#include "runtime/comm/exact_sum.h"

#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "runtime/comm/process_group.h"

namespace lockstep {

namespace exact {

int ceil_log2(int64_t items) {
  int bits = 0;
  while ((int64_t(1) << bits) < items) ++bits;
  return bits;
}

int exponent_of(double largest) {
  int exponent = 0;
  std::frexp(largest, &exponent);
  return exponent;
}

}  // namespace exact

std::vector<double> exact_column_sums(CollectiveGroup& group, const at::Tensor& items, int64_t columns,
                                      int64_t total_items, const c10::Device& device) {
  torch::NoGradGuard no_grad;
  const at::Tensor rows = items.numel() == 0 ? torch::zeros({0, columns}, torch::kDouble)
                                             : items.to(at::kCPU).to(at::kDouble).reshape({-1, columns});
  // 1. Each column's largest magnitude over every item (inf where one is not finite).
  at::Tensor largest = torch::zeros({columns}, torch::kDouble);
  if (rows.size(0) > 0) {
    largest = rows.abs().amax(0);
    largest.masked_fill_(~rows.isfinite().all(0), std::numeric_limits<double>::infinity());
  }
  std::vector<at::Tensor> io{largest.to(device)};
  group.allreduce_max(io).wait();
  largest = io[0].cpu();
  // 2. On each column's grid, as integers, then the integer sums.
  const int headroom = exact::ceil_log2(std::max<int64_t>(1, total_items));
  std::vector<double> units(size_t(columns), 0.0);
  at::Tensor sums = torch::zeros({columns}, torch::kLong);
  const double* top = largest.data_ptr<double>();
  const at::Tensor contiguous = rows.contiguous();
  const double* values = contiguous.data_ptr<double>();
  int64_t* out = sums.data_ptr<int64_t>();
  for (int64_t c = 0; c < columns; ++c) {
    if (!std::isfinite(top[c]) || top[c] == 0) continue;
    units[size_t(c)] = std::ldexp(1.0, exact::kGridBits - exact::exponent_of(top[c]) - headroom);
    for (int64_t r = 0; r < contiguous.size(0); ++r)
      out[c] += std::llrint(values[r * columns + c] * units[size_t(c)]);
  }
  io = {sums.to(device)};
  group.allreduce_sum(io).wait();
  sums = io[0].cpu();
  std::vector<double> result(size_t(columns), 0.0);
  for (int64_t c = 0; c < columns; ++c) {
    if (!std::isfinite(top[c])) result[size_t(c)] = std::numeric_limits<double>::quiet_NaN();
    else if (top[c] != 0) result[size_t(c)] = double(sums.data_ptr<int64_t>()[c]) / units[size_t(c)];
  }
  return result;
}

}  // namespace lockstep

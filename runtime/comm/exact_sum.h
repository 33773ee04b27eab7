#pragma once
// Sums over the ranks of a group that do not depend on how the items were
// divided among the ranks, on the number of ranks or on the order anything
// arrived: every value goes onto one integer grid per column, fixed by the
// column's largest magnitude over all items, and the integers are summed.
// The answer is the exact sum of the values on that grid, rounded once.
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace lockstep {

class CollectiveGroup;

namespace exact {
// A column's grid holds 2^(62 - e - ceil(log2 items)) units per 1 where
// 2^e bounds its largest magnitude: `items` values sum within an int64.
constexpr int kGridBits = 62;
int ceil_log2(int64_t items);
int exponent_of(double largest);  // largest < 2^exponent_of(largest); 0 for zero
}  // namespace exact

// `items`: this rank's rows (2-D, any floating dtype, any device; 0 rows
// allowed), one per item (a microbatch, a test chunk), `columns` wide.
// Returns, on every rank, each column's sum over every item of every rank
// (`total_items` in all, the same on every rank). A column holding a
// non-finite value sums to NaN. Two all-reduces on `group` (a maximum,
// then the integer sums), on the group's `device`.
std::vector<double> exact_column_sums(CollectiveGroup& group, const at::Tensor& items, int64_t columns,
                                      int64_t total_items, const c10::Device& device);

}  // namespace lockstep

#include "runtime/comm/reducer.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <cmath>
#include <limits>

#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "runtime/base/errors.h"
#include "runtime/comm/exact_sum.h"

namespace lockstep {

GradientReducer::GradientReducer(std::vector<std::pair<std::string, at::Tensor>> params,
                                 CollectiveGroup& group, ReducerOptions options)
    : params_(std::move(params)), group_(group), options_(options) {
  Bucket current;
  int64_t bytes = 0;
  int64_t limit = std::min(options.first_bucket_bytes, options.bucket_bytes);
  for (size_t i = params_.size(); i-- > 0;) {
    const at::Tensor& p = params_[i].second;
    int64_t size = p.numel() * int64_t(p.element_size());
    if (!current.members.empty() && bytes + size > limit) {
      buckets_.push_back(std::move(current));
      current = Bucket{};
      bytes = 0;
      limit = options.bucket_bytes;
    }
    current.members.push_back(i);
    bytes += size;
  }
  if (!current.members.empty()) buckets_.push_back(std::move(current));
  places_.resize(params_.size());
  int64_t offset = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].start = offset;
    for (size_t i : buckets_[b].members) {
      places_[i] = {b, offset};
      offset += params_[i].second.numel();
    }
    buckets_[b].length = offset - buckets_[b].start;
  }
  const auto tensor_options = params_.front().second.options().requires_grad(false);
  gradients_ = torch::zeros({offset + kTailSlots}, tensor_options);
  parameters_ = torch::empty({offset}, tensor_options);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& p = params_[i].second;
      at::Tensor home = parameters_.narrow(0, places_[i].offset, p.numel()).view(p.sizes());
      home.copy_(p);
      p.set_data(home);  // same tensor for the model, new memory
    }
  }
  bind_gradients(/*keep_values=*/true);
  arrived_.assign(params_.size(), false);
  ever_arrived_.assign(params_.size(), false);
  // After the accumulator has added this microbatch's gradient into the
  // bucket (a tensor hook would run before it, too early to send).
  for (size_t i = 0; i < params_.size(); ++i) {
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(params_[i].second));
    hook_keys_.push_back(accumulators_.back()->add_post_hook(
        std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, i](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list&) {
              on_gradient(i);
              return outputs;
            })));
  }
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < hook_keys_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

at::Tensor GradientReducer::slot_of(size_t index) const {
  const at::Tensor& p = params_[index].second;
  return gradients_.narrow(0, places_[index].offset, p.numel()).view(p.sizes());
}

at::Tensor GradientReducer::tail_slot(int64_t slot) const {
  return gradients_[gradients_.numel() - kTailSlots + slot];
}

void GradientReducer::bind_gradients(bool keep_values) {
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i].second;
    const at::Tensor& grad = p.grad();
    at::Tensor slot = slot_of(i);
    if (grad.defined() && grad.data_ptr() == slot.data_ptr()) continue;
    if (keep_values) {
      if (grad.defined()) slot.copy_(grad);
      else slot.zero_();
    }
    p.mutable_grad() = slot;
  }
}

void GradientReducer::start_step(bool zero_gradients) {
  if (zero_gradients) gradients_.zero_();
  held_.clear();
  largest_.clear();
  loss_nonfinite_ = false;
  // Exact: each bucket's first values of the step overwrite its sums; the
  // tail and the histograms start from zero.
  if (sums_.defined()) {
    const int64_t tail_start = gradients_.numel() - kTailSlots;
    sums_.narrow(0, tail_start, sums_.numel() - tail_start).zero_();
  }
  std::fill(fresh_.begin(), fresh_.end(), true);
  std::fill(counted_, counted_ + 3, 0.0);
  for (auto& bucket : buckets_) {
    bucket.launched = false;
    bucket.work.reset();
  }
  io_.clear();
  bind_gradients(/*keep_values=*/!zero_gradients);
  tail_slot(kRanksMissingGradients).fill_(0.0);
  tail_slot(kRanksAskingToStop).fill_(0.0);
  tail_slot(kLossSum).fill_(0.0);
  tail_slot(kSamples).fill_(0.0);
  stop_agreed_ = false;
  next_launch_ = 0;
  launched_early_ = 0;
  collectives_ = 0;
  late_gradient_.clear();
  std::fill(ever_arrived_.begin(), ever_arrived_.end(), false);
}

void GradientReducer::begin_microbatch(int64_t micro, int64_t count, double valid, double loss_sum,
                                       double samples) {
  if (micro == 0) start_step(/*zero_gradients=*/true);
  // Exact: this microbatch's own figures (summed exactly later, whoever
  // computed it). Float: the rank's running sums, as the gradients are.
  if (!options_.exact) {
    counted_[0] += valid, counted_[1] += loss_sum, counted_[2] += samples;
    valid = counted_[0], loss_sum = counted_[1], samples = counted_[2];
  }
  std::fill(arrived_.begin(), arrived_.end(), false);
  for (auto& bucket : buckets_) bucket.waiting = int64_t(bucket.members.size());
  last_microbatch_ = micro + 1 == count;
  tail_slot(kValidCount).fill_(valid);
  tail_slot(kLossSum).fill_(loss_sum);
  tail_slot(kSamples).fill_(samples);
  if (asking_to_stop_) tail_slot(kRanksAskingToStop).fill_(1.0);
}

void GradientReducer::on_gradient(size_t index) {
  Bucket& bucket = buckets_[places_[index].bucket];
  if (bucket.launched && late_gradient_.empty()) late_gradient_ = params_[index].first;
  ever_arrived_[index] = true;
  if (arrived_[index]) return;
  arrived_[index] = true;
  if (--bucket.waiting != 0 || !last_microbatch_ || !options_.overlap) return;
  if (!options_.exact) return launch_ready();
  // Exact: each ready bucket goes onto its grid and out, in index order.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].waiting == 0) {
    launch_exact(next_launch_);
    ++launched_early_;
  }
}

void GradientReducer::launch(size_t first, size_t end) {
  const int64_t start = buckets_[first].start;
  const int64_t stop = end == buckets_.size() ? gradients_.numel()  // with the tail slots
                                              : buckets_[end - 1].start + buckets_[end - 1].length;
  io_.push_back(gradients_.narrow(0, start, stop - start));
  std::vector<at::Tensor> span{io_.back()};
  PendingCollective work = group_.allreduce_sum(span);
  for (size_t b = first; b < end; ++b) {
    buckets_[b].work = work;
    buckets_[b].launched = true;
  }
  ++collectives_;
  next_launch_ = end;
}

void GradientReducer::launch_ready() {
  // One all-reduce per bucket: which buckets are ready together depends on
  // this rank's graph, and every rank must issue the same collectives.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].waiting == 0) {
    launch(next_launch_, next_launch_ + 1);
    ++launched_early_;
  }
}

std::string GradientReducer::missing_gradients() const {
  std::string missing;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ever_arrived_[i]) missing += (missing.empty() ? "" : ", ") + params_[i].first;
  return missing;
}

double GradientReducer::finish() {
  const std::string missing = missing_gradients();
  // The last bucket can only have started during backward if every
  // gradient arrived (buckets start in order), so the flag is still unsent.
  if (!missing.empty()) tail_slot(kRanksMissingGradients).fill_(1.0);
  const int64_t element = int64_t(gradients_.element_size());
  if (options_.exact) {
    reduce_exactly();
  } else {
    for (size_t b = 0; b < next_launch_; ++b)  // finished before backward ended: hidden
      if (buckets_[b].work->done()) bytes_hidden_ += buckets_[b].length * element;
    if (!options_.overlap) {
      launch(0, buckets_.size());  // nothing started during backward on any rank: all as one
    } else {
      while (next_launch_ < buckets_.size()) launch(next_launch_, next_launch_ + 1);
    }
    for (auto& bucket : buckets_) {
      bytes_reduced_ += bucket.length * element;
      bucket.work->wait();
    }
  }
  // The counts that rode along, read in one copy (one wait, on a GPU).
  const at::Tensor tail = gradients_.narrow(0, gradients_.numel() - kTailSlots, kTailSlots).to(at::kDouble).cpu();
  const double* counts = tail.data_ptr<double>();
  const double global_count = counts[kValidCount];
  global_loss_sum_ = counts[kLossSum];
  global_samples_ = counts[kSamples];
  const auto ranks_missing = int64_t(counts[kRanksMissingGradients]);
  stop_agreed_ = counts[kRanksAskingToStop] > 0.5;
  asking_to_stop_ = false;

  if (!late_gradient_.empty())
    throw RunError("the gradient of " + late_gradient_ + " was accumulated after its bucket's " +
                   "all-reduce had started: backward ran twice in one microbatch (one backward "
                   "per microbatch; use train.accum_steps for more)");
  if (ranks_missing > 0 && options_.error_on_unused)
    throw RunError(std::to_string(ranks_missing) + " of " + std::to_string(group_.size()) +
                   " ranks got no gradient for some parameters in this step (rank " +
                   std::to_string(group_.rank()) + ": " + (missing.empty() ? "none" : missing) +
                   "). A forward that skips parameters needs comm.unused_parameters = \"zero\" "
                   "(they then count as zero gradients); otherwise check the model's forward");
  if (!missing.empty() && !reported_unused_) {
    reported_unused_ = true;
    spdlog::warn("Decision: unused_parameters = {} (no gradient arrived this step; "
                 "comm.unused_parameters = \"zero\": they count as zero in the all-reduce)",
                 missing);
  }
  // The mean, in place in every .grad (exact: taken while leaving the integers).
  if (!options_.exact) gradients_.mul_(global_count > 0 ? 1.0 / global_count : 1.0);
  return global_count;
}

namespace {

// Each bucket's grid: 2^(62 - g - ceil(log2 k)) units per 1, where 2^g
// bounds the bucket's largest magnitude over every microbatch of the step,
// so that k of them sum to less than 2^62 in an int64. g is the largest
// magnitude's binary exponent rounded up to a multiple of 8: a function of
// the step's gradients alone (never of the step before, so a resumed or
// re-formed run sums on the grid the uninterrupted one used), and coarse
// enough that the next step usually falls on the same grid, which is used
// ahead: a second all-reduce only when a bucket's class changes.
using exact::ceil_log2;
using exact::exponent_of;
using exact::kGridBits;
constexpr int kGridStride = 8;
constexpr double kTailUnit = 4294967296.0;  // 2^32: the tail's fixed grid
// Exponents as frexp gives them for fp32/bf16/fp16 values: [-148, 128];
// one more slot for inf/NaN. A bucket's histogram counts, per rank, the
// exponent of its largest magnitude: the highest slot any rank filled is
// the step's (a maximum carried by a sum).
constexpr int kLowestExponent = -150, kExponentSlots = 281;
constexpr int kNonfiniteSlot = kExponentSlots - 1;
constexpr int kNoGrid = INT32_MIN;  // a bucket of zeros (or not known yet)

int grid_of(int exponent) {
  const int below = ((exponent % kGridStride) + kGridStride) % kGridStride;
  return exponent - below + kGridStride;
}

// Round half to even by adding and taking away 1.5 * 2^52: exact for
// |y| < 2^51, the integer read from the sum's bits (no conversion
// instruction, so the loop below vectorises).
constexpr double kRounder = 6755399441055744.0;      // 1.5 * 2^52
constexpr int64_t kRounderBits = 0x4338000000000000LL;
constexpr double kRoundsExactlyBelow = 2251799813685248.0;  // 2^51

inline int64_t round_by_rounder(double y) {
  const double rounded = y + kRounder;
  int64_t bits;
  std::memcpy(&bits, &rounded, sizeof bits);
  return bits - kRounderBits;
}

// One block of fp32 values onto the grid: out (+)= round(x * unit), half
// to even, by round_by_rounder (`*big` says some value was 2^51 units or
// more, where x * unit is an integer already and quantize_add puts it right). `*top` gets the largest
// magnitude's bits (above 0x7f7fffff: inf or NaN). Compiled for the vector
// units the machine has; every version computes the same integers.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void quantize_block(const float* x, int64_t* out, int64_t n, double unit, bool assign, uint32_t* top,
                    bool* big) {
  uint32_t largest = 0;
  int above = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x[i], sizeof bits);
    bits &= 0x7fffffffu;
    largest = bits > largest ? bits : largest;
    const double y = double(x[i]) * unit;
    above |= std::fabs(y) >= kRoundsExactlyBelow;
    const int64_t units = round_by_rounder(y);
    out[i] = assign ? units : out[i] + units;
  }
  *top = largest;
  *big = above != 0;
}

// target = sums * scale, each rounded once to fp32 (via double: the
// integer's nearest double, times scale, rounded; the same in every version).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void dequantize_block(const int64_t* sums, float* target, int64_t n, double scale) {
  for (int64_t i = 0; i < n; ++i) target[i] = float(double(sums[i]) * scale);
}

// sums += round(values * unit) elementwise in int64 (when `add`; sums =
// when `assign`, for the first values of a step); returns the largest
// magnitude of `values` (inf when one is not finite). On the CPU for fp32
// in blocks (above); tensor operations elsewhere, with the same rounding.
double quantize_add(const at::Tensor& values, at::Tensor sums, double unit, bool add, bool assign) {
  if (values.device().is_cpu() && values.scalar_type() == at::kFloat && values.is_contiguous() &&
      sums.is_contiguous()) {
    const float* x = values.data_ptr<float>();
    int64_t* out = sums.data_ptr<int64_t>();
    const int64_t n = values.numel();
    constexpr int64_t kGrain = 1 << 15, kBlock = 1024;
    constexpr uint32_t kLargestFinite = 0x7f7fffffu;
    std::vector<uint32_t> largest(size_t((n + kGrain - 1) / kGrain + 1), 0);
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      uint32_t top = 0;
      for (int64_t start = begin; start < end; start += kBlock) {
        const int64_t count = std::min(kBlock, end - start);
        uint32_t block_top = 0;
        bool big = false;
        if (add) {
          quantize_block(x + start, out + start, count, unit, assign, &block_top, &big);
        } else {
          for (int64_t i = start; i < start + count; ++i) {
            uint32_t bits;
            std::memcpy(&bits, &x[i], sizeof bits);
            block_top = std::max(block_top, bits & 0x7fffffffu);
          }
        }
        top = std::max(top, block_top);
        if (!big || block_top > kLargestFinite) continue;  // a non-finite bucket's sum is never read
        // Values of 2^51 units and more: integers already; the block's
        // rounding trick got them wrong, put them right.
        for (int64_t i = start; i < start + count; ++i) {
          const double y = double(x[i]) * unit;
          if (std::fabs(y) >= kRoundsExactlyBelow) out[i] += int64_t(y) - round_by_rounder(y);
        }
      }
      largest[size_t(begin / kGrain)] = top;
    });
    const uint32_t top = *std::max_element(largest.begin(), largest.end());
    if (top > kLargestFinite) return std::numeric_limits<double>::infinity();
    float magnitude;
    std::memcpy(&magnitude, &top, sizeof magnitude);
    return double(magnitude);
  }
  const double top = values.abs().max().to(at::kDouble).item<double>();
  if (!std::isfinite(top)) return std::numeric_limits<double>::infinity();
  if (!add) return top;
  const at::Tensor units = values.to(at::kDouble).mul(unit).round().to(at::kLong).to(sums.device());
  if (assign) sums.copy_(units);
  else sums.add_(units);
  return top;
}

// target = sums / unit * factor, rounded once to the target's dtype.
void dequantize(const at::Tensor& sums, at::Tensor target, double unit, double factor) {
  const double inverse = factor / unit;
  if (target.device().is_cpu() && target.scalar_type() == at::kFloat && target.is_contiguous() &&
      sums.device().is_cpu() && sums.is_contiguous()) {
    const int64_t* in = sums.data_ptr<int64_t>();
    float* out = target.data_ptr<float>();
    at::parallel_for(0, target.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
      dequantize_block(in + begin, out + begin, end - begin, inverse);
    });
    return;
  }
  target.copy_(sums.to(target.device()).to(at::kDouble).mul(inverse));  // the same one rounding
}

}  // namespace

void GradientReducer::end_microbatch() {
  if (!options_.exact) return;
  // The flags are the step's, not a microbatch's: they stay in the tail.
  if (asking_to_stop_) tail_slot(kRanksAskingToStop).fill_(1.0);
  if (last_microbatch_) return;  // its buckets go out as they are ready, or in finish()
  for (size_t b = 0; b < buckets_.size(); ++b) quantize_bucket(gradients_, b);
  quantize_tail(gradients_);
  held_.push_back(gradients_.clone());  // kept for a step whose grid changes
  gradients_.zero_();
}

void GradientReducer::prepare_exact() {
  const size_t count = buckets_.size();
  if (grid_.size() != count) grid_.assign(count, kNoGrid);
  if (largest_.size() != count) largest_.assign(count, 0.0);
  if (fresh_.size() != count) fresh_.assign(count, true);
  if (!sums_.defined())  // gradients, tail, per bucket a histogram, one flag
    sums_ = at::zeros({gradients_.numel() + int64_t(count) * kExponentSlots + 1}, at::kLong);
}

void GradientReducer::quantize_bucket(const at::Tensor& microbatch, size_t b) {
  torch::NoGradGuard no_grad;
  prepare_exact();
  const int headroom = ceil_log2(std::max<int64_t>(1, options_.microbatches_per_step));
  const bool on_grid = grid_[b] != kNoGrid;
  const double unit = on_grid ? std::ldexp(1.0, kGridBits - grid_[b] - headroom) : 0.0;
  const double top = quantize_add(microbatch.narrow(0, buckets_[b].start, buckets_[b].length),
                                  sums_.narrow(0, buckets_[b].start, buckets_[b].length), unit, on_grid,
                                  /*assign=*/fresh_[b]);
  if (on_grid) fresh_[b] = false;
  largest_[b] = std::isfinite(top) ? std::max(largest_[b], top) : top;
}

void GradientReducer::quantize_tail(const at::Tensor& microbatch) {
  prepare_exact();
  // The microbatch's counts and loss sum on the tail's fixed grid.
  const int64_t tail_start = gradients_.numel() - kTailSlots;
  const at::Tensor tail = microbatch.narrow(0, tail_start, kTailSlots).to(at::kDouble).cpu();
  const double* figures = tail.data_ptr<double>();
  int64_t* sums = sums_.data_ptr<int64_t>() + tail_start;
  for (int64_t slot : {kValidCount, kLossSum, kSamples}) {
    if (!std::isfinite(figures[slot])) {
      loss_nonfinite_ = true;
      continue;
    }
    sums[slot] += std::llrint(figures[slot] * kTailUnit);
  }
}

void GradientReducer::launch_exact(size_t b) {
  quantize_bucket(gradients_, b);
  const bool last = b + 1 == buckets_.size();
  int64_t stop = buckets_[b].start + buckets_[b].length;
  if (last) {
    // With the last bucket: the tail, the step's flags, and per bucket its
    // exponent histogram, then one slot counting ranks whose loss sum was
    // not finite (every bucket's largest magnitude is known by now).
    quantize_tail(gradients_);
    const int64_t tail_start = gradients_.numel() - kTailSlots;
    const int64_t histogram_start = gradients_.numel();
    int64_t* all = sums_.data_ptr<int64_t>();
    all[tail_start + kRanksMissingGradients] = tail_slot(kRanksMissingGradients).item<double>() > 0 ? 1 : 0;
    all[tail_start + kRanksAskingToStop] = tail_slot(kRanksAskingToStop).item<double>() > 0 ? 1 : 0;
    for (size_t c = 0; c < buckets_.size(); ++c) {
      const double largest = largest_[c];
      const int slot = !std::isfinite(largest) ? kNonfiniteSlot
                       : largest == 0          ? -1
                                               : std::clamp(exponent_of(largest) - kLowestExponent, 0, kNonfiniteSlot - 1);
      if (slot >= 0) all[histogram_start + int64_t(c) * kExponentSlots + slot] = 1;
    }
    all[sums_.numel() - 1] = loss_nonfinite_ ? 1 : 0;
    stop = sums_.numel();
  }
  at::Tensor span = sums_.narrow(0, buckets_[b].start, stop - buckets_[b].start);
  if (!gradients_.device().is_cpu()) span = span.to(gradients_.device());  // NCCL reduces device tensors only
  io_.push_back(span);
  buckets_[b].launched = true;
  if (group_.size() == 1) {  // the sums are this rank's already
    next_launch_ = b + 1;
    return;
  }
  std::vector<at::Tensor> tensors{span};
  buckets_[b].work = group_.allreduce_sum(tensors);
  bytes_reduced_ += span.numel() * int64_t(span.element_size());
  ++collectives_;
  next_launch_ = b + 1;
}

void GradientReducer::reduce_exactly() {
  torch::NoGradGuard no_grad;
  prepare_exact();
  const int64_t tail_start = gradients_.numel() - kTailSlots;
  const size_t count = buckets_.size();
  const int headroom = ceil_log2(std::max<int64_t>(1, options_.microbatches_per_step));
  for (size_t b = 0; b < next_launch_; ++b)  // finished before backward ended: hidden
    if (buckets_[b].work && buckets_[b].work->done()) bytes_hidden_ += buckets_[b].length * int64_t(sizeof(int64_t));
  while (next_launch_ < count) launch_exact(next_launch_);
  for (auto& bucket : buckets_)
    if (bucket.work) bucket.work->wait();
  // The all-reduced spans, back in one host tensor of sums_'s layout.
  at::Tensor reduced = sums_;
  if (!gradients_.device().is_cpu()) {
    reduced = at::empty_like(sums_);
    for (size_t b = 0; b < count; ++b)
      reduced.narrow(0, buckets_[b].start, io_[b].numel()).copy_(io_[b]);
  }
  const int64_t histogram_start = gradients_.numel();
  const int64_t* slots = reduced.data_ptr<int64_t>() + histogram_start;
  // The step's grids, from the histograms: the same on every rank and world size.
  std::vector<int> actual(count, kNoGrid);
  std::vector<bool> nonfinite(count, false);
  bool redo = false;
  for (size_t b = 0; b < count; ++b) {
    const int64_t* h = slots + int64_t(b) * kExponentSlots;
    if (h[kNonfiniteSlot] > 0) {
      nonfinite[b] = true;
      continue;
    }
    for (int slot = kNonfiniteSlot - 1; slot >= 0; --slot)
      if (h[slot] > 0) {
        actual[b] = grid_of(slot + kLowestExponent);
        break;
      }
    if (actual[b] != kNoGrid && actual[b] != grid_[b]) redo = true;
  }
  const bool loss_nonfinite = slots[sums_.numel() - histogram_start - 1] > 0;
  const at::Tensor tail_sums = reduced.narrow(0, tail_start, kTailSlots).clone();
  // Buckets whose grid class changed (or the first step's): again on the
  // step's own grid, a second all-reduce of those buckets only.
  // On the CPU `reduced` is sums_ itself: a bucket summed again overwrites
  // its own span (its first microbatch assigns), the others keep the first
  // round's sums.
  if (redo) {
    std::vector<at::Tensor> spans;
    std::vector<size_t> again;
    for (size_t b = 0; b < count; ++b) {
      if (actual[b] == kNoGrid || actual[b] == grid_[b]) continue;
      grid_[b] = actual[b];
      fresh_[b] = true;
      for (const at::Tensor& held : held_) quantize_bucket(held, b);
      quantize_bucket(gradients_, b);
      at::Tensor span = sums_.narrow(0, buckets_[b].start, buckets_[b].length);
      if (!gradients_.device().is_cpu()) span = span.to(gradients_.device());
      spans.push_back(span);
      again.push_back(b);
    }
    std::vector<PendingCollective> pending;
    for (at::Tensor& span : spans) {
      if (group_.size() == 1) continue;
      std::vector<at::Tensor> io{span};
      pending.push_back(group_.allreduce_sum(io));
      bytes_reduced_ += span.numel() * int64_t(span.element_size());
    }
    for (size_t i = 0; i < spans.size(); ++i) {
      if (i < pending.size()) pending[i].wait();
      if (!gradients_.device().is_cpu())  // back from the device into the host copy
        reduced.narrow(0, buckets_[again[i]].start, buckets_[again[i]].length).copy_(spans[i]);
    }
    ++regrids_;
  }
  // The next step starts on this one's grids.
  for (size_t b = 0; b < count; ++b)
    if (actual[b] != kNoGrid) grid_[b] = actual[b];
  // Back to the gradients' dtype: the mean over the global count, one
  // rounding from the exact sum.
  const double global_count = double(tail_sums.data_ptr<int64_t>()[kValidCount]) / kTailUnit;
  const double factor = global_count > 0 ? 1.0 / global_count : 1.0;
  for (size_t b = 0; b < count; ++b) {
    at::Tensor target = gradients_.narrow(0, buckets_[b].start, buckets_[b].length);
    if (nonfinite[b]) target.fill_(std::numeric_limits<double>::quiet_NaN());
    else if (actual[b] == kNoGrid) target.zero_();
    else dequantize(reduced.narrow(0, buckets_[b].start, buckets_[b].length), target,
                    std::ldexp(1.0, kGridBits - actual[b] - headroom), factor);
  }
  at::Tensor tail_values = tail_sums.to(at::kDouble);
  for (int64_t slot : {kValidCount, kLossSum, kSamples}) tail_values[slot].div_(kTailUnit);
  if (loss_nonfinite) tail_values[kLossSum] = std::numeric_limits<double>::quiet_NaN();
  gradients_.narrow(0, tail_start, kTailSlots).copy_(tail_values);
}

double GradientReducer::allreduce_mean(double local_count) {
  start_step(/*zero_gradients=*/false);  // .grad as it is; an undefined one is zeros
  std::fill(arrived_.begin(), arrived_.end(), true);
  std::fill(ever_arrived_.begin(), ever_arrived_.end(), true);
  last_microbatch_ = true;
  tail_slot(kValidCount).fill_(local_count);
  return finish();
}

int64_t GradientReducer::nonfinite_count() const {
  at::Tensor values = gradients_.narrow(0, 0, parameters_.numel());
  if (std::isfinite(values.sum().item<double>())) return 0;  // the common case: one pass
  return (~values.isfinite()).sum().item<int64_t>();
}

std::pair<at::Tensor, at::Tensor> GradientReducer::flat() const {
  return {parameters_, gradients_.narrow(0, 0, parameters_.numel())};
}

std::vector<std::vector<std::string>> GradientReducer::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& bucket : buckets_) {
    out.emplace_back();
    for (size_t i : bucket.members) out.back().push_back(params_[i].first);
  }
  return out;
}

}  // namespace lockstep

#include "runtime/audit/arithmetic_probe.h"

#include <chrono>
#include <map>

#include <fmt/format.h>
#include <torch/torch.h>

#include "runtime/base/errors.h"
#include "runtime/model/digest.h"

namespace lockstep {
namespace {

// A fixed stream of numbers, not LibTorch's generator (whose state the run owns).
class Lcg {
 public:
  uint32_t next() {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return uint32_t(state_ >> 33);
  }

 private:
  uint64_t state_ = 0x6c6f636b73746570ULL;  // fixed: the same workload everywhere
};

constexpr int64_t kRows = 96, kInner = 80, kColumns = 64;

}  // namespace

ProbeResult run_arithmetic_probe(const c10::Device& device, bool flip_a_bit) {
  torch::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  ProbeResult result;
  Lcg numbers;
  // Exact: entries -8..8, so every product and partial sum is an integer far
  // below 2^24, which float32 holds exactly in any order of summation.
  std::vector<int64_t> a(kRows * kInner), b(kInner * kColumns);
  for (auto& v : a) v = int64_t(numbers.next() % 17) - 8;
  for (auto& v : b) v = int64_t(numbers.next() % 17) - 8;
  const auto options = torch::TensorOptions().dtype(torch::kFloat);
  const at::Tensor ta = torch::tensor(a, torch::kLong).view({kRows, kInner}).to(options).to(device);
  const at::Tensor tb = torch::tensor(b, torch::kLong).view({kInner, kColumns}).to(options).to(device);
  at::Tensor product = torch::mm(ta, tb).cpu().contiguous();
  if (flip_a_bit) product.view(-1).narrow(0, 7, 1).view(at::kInt).bitwise_xor_(1);
  const float* got = product.data_ptr<float>();
  for (int64_t i = 0; i < kRows && result.exact_error.empty(); ++i)
    for (int64_t j = 0; j < kColumns; ++j) {
      int64_t expected = 0;
      for (int64_t k = 0; k < kInner; ++k) expected += a[size_t(i * kInner + k)] * b[size_t(k * kColumns + j)];
      if (double(got[i * kColumns + j]) != double(expected)) {
        result.exact_error = fmt::format("element ({}, {}) of a {}x{} by {}x{} integer matrix product is {:.9g}, "
                                         "not {}", i, j, kRows, kInner, kInner, kColumns, got[i * kColumns + j],
                                         expected);
        break;
      }
    }
  // Kernels: float work that rounds, digested bit for bit.
  std::vector<float> values(128 * 128);
  for (auto& v : values) v = float(int32_t(numbers.next() % 2001) - 1000) / 1000.0f;
  const at::Tensor x = torch::tensor(values).view({128, 128}).to(device);
  const at::Tensor mixed = torch::softmax(torch::tanh(torch::mm(x, x.t()) * 0.05), 1);
  const at::Tensor kernel = x.narrow(0, 0, 4).narrow(1, 0, 9).reshape({4, 1, 3, 3});
  at::Tensor conv = torch::conv2d(mixed.view({1, 1, 128, 128}), kernel).cpu().contiguous();
  if (flip_a_bit) conv.view(-1).narrow(0, 3, 1).view(at::kInt).bitwise_xor_(1);
  result.kernel_digest = digest(conv).high ^ digest(mixed.cpu()).low;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void check_arithmetic(ControlGroup& control, const ProbeResult& mine, const std::string& kernels,
                      const std::vector<std::string>& hosts, DecisionLog& decisions) {
  const auto exact = control.exchange("probe-exact", mine.exact_error);
  const auto digests = control.exchange("probe-kernels", fmt::format("{:016x}", mine.kernel_digest));
  const auto identities = control.exchange("probe-identity", kernels);
  const int world = int(exact.size());
  auto named = [&](int r) { return "rank " + std::to_string(r) + " (" + hosts.at(size_t(r)) + ")"; };
  std::string wrong;
  for (int r = 0; r < world; ++r)
    if (!exact[size_t(r)].empty()) wrong += (wrong.empty() ? "" : "; ") + named(r) + ": " + exact[size_t(r)];
  // Ranks with the same kernels must agree; the majority's digest is theirs.
  std::map<std::string, std::vector<int>> groups;
  for (int r = 0; r < world; ++r) groups[identities[size_t(r)]].push_back(r);
  for (const auto& [identity, ranks] : groups) {
    std::map<std::string, std::vector<int>> by_digest;
    for (int r : ranks) by_digest[digests[size_t(r)]].push_back(r);
    if (by_digest.size() == 1) continue;
    size_t most = 0;
    int holders = 0;
    for (const auto& [digest, members] : by_digest) {
      if (members.size() > most) most = members.size(), holders = 1;
      else if (members.size() == most) ++holders;
    }
    for (const auto& [digest, members] : by_digest) {
      if (members.size() == most && holders == 1) continue;  // the majority
      for (int r : members)
        wrong += (wrong.empty() ? "" : "; ") + named(r) + ": float kernels digest " + digest +
                 (holders == 1 ? ", the other ranks with the same kernels got another"
                               : ", ranks with the same kernels split with no majority");
    }
  }
  if (!wrong.empty())
    throw RunError("arithmetic probe: " + wrong + ". A processor that computes a fixed workload wrong will "
                   "compute gradients wrong: refused before training; take that host out of the job");
  decisions.record("arithmetic_probe", "agreed",
                   fmt::format("a fixed workload on every rank before training: the exact integer product right "
                               "on all {} rank(s), the float kernels' digest equal among ranks with the same "
                               "kernels ({} kind(s) of kernels)",
                               world, groups.size()),
                   /*warn=*/false);
}

}  // namespace lockstep

#pragma once
// The arithmetic probe at start (step 3 of the data flow, before the
// model): every rank computes a fixed workload on its training device and
// the results are compared before any step is trained.
//   exact    integer-valued matrices whose float products and sums are
//            exact: the answer is known on any processor, so a rank that
//            gets another is wrong on its own;
//   kernels  float work that rounds (matmul, tanh, softmax, a convolution):
//            its bits depend on the kernels, so ranks are compared with the
//            others that run the same kernels (processor model and
//            features, GPU, LibTorch, threads); one that disagrees with
//            their majority is wrong. Two that disagree with no majority
//            are both named.
// A rank found wrong is refused: RunError on every rank, naming it.
#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "runtime/comm/control_group.h"
#include "runtime/run/decisions.h"

namespace lockstep {

struct ProbeResult {
  std::string exact_error;  // "" when the exact workload came out right, else the first wrong element
  uint64_t kernel_digest = 0;
  double seconds = 0;
};

// `flip_a_bit`: test.probe_fault_rank's rank gets one bit of each workload wrong.
ProbeResult run_arithmetic_probe(const c10::Device& device, bool flip_a_bit);

// All-gathers the results with each rank's `kernels` (what decides its
// bits); records the outcome as a decision (the same text on every rank,
// so it prints once), or throws RunError naming the ranks that computed
// wrong and their hosts.
void check_arithmetic(ControlGroup& control, const ProbeResult& mine, const std::string& kernels,
                      const std::vector<std::string>& hosts, DecisionLog& decisions);

}  // namespace lockstep

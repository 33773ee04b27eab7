#pragma once
// Seeding in two halves, each checked (step 3 of the data flow):
//   1. manual_seed(seed) on every rank, build and initialise the model, then
//      check that every rank holds bit-identical parameters;
//   2. manual_seed(seed + rank), then check that the ranks' random streams
//      now differ, by drawing a dropout mask from a copy of the generator so
//      the stream itself is not consumed.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/control_group.h"
#include "runtime/run/decisions.h"
#include "runtime/model/model.h"


namespace lockstep {

// Seeds LibTorch's default generators.
void seed_everything(uint64_t seed);

// The seed of microbatch `microbatch` of step `step` (0-based): a mix of
// the three, so its draws (dropout in any model, LibTorch's generator) are
// the same whichever rank computes it and whatever ran before it in that
// process. The trainer seeds every generator with it before the
// microbatch's forward.
uint64_t microbatch_seed(uint64_t seed, int64_t step, int64_t microbatch);

// All-gathers every parameter's digest on the control group. Returns the
// combined digest when all ranks agree; otherwise throws RunError naming the
// first differing tensor and which ranks hold which version.
std::string verify_identical_parameters(ControlGroup& control, const Model& model,
                                        DecisionLog& log);

// Hash of a 4096-element Bernoulli(0.5) mask (a dropout mask) drawn from a
// clone of the default CPU generator: the stream is not advanced.
uint64_t dropout_mask_probe();

struct StreamCheck {
  std::vector<uint64_t> probes;  // per rank
  bool all_distinct = true;      // false: some ranks share a random stream
};

// All-gathers dropout_mask_probe() and records the outcome as a decision
// (a warning when two ranks share a stream).
StreamCheck check_streams_differ(ControlGroup& control, DecisionLog& log);

}  // namespace lockstep

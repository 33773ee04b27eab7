#pragma once
// Cross-checks of the arithmetic (audit.verify_every). The drift audit
// proves that ranks agree; it cannot see a rank that computes a wrong
// gradient, since the all-reduce hands the wrong sum to everyone. With
// exact summation a microbatch computes the same bits on any rank, so at a
// checked step every rank recomputes one microbatch another rank computed
// and the digests of the two gradients (per parameter) and losses are
// compared; every rank reaches the same verdict.
//
// Rotation: the c-th check (steps N, 2N, ...: c = step / N) has rank r
// recompute a microbatch of rank (r + 1 + c mod (W - 1)) mod W, its
// (c mod per_rank)-th: every rank is checked at every check, by a checker
// that rotates, each of its microbatches in turn. A step asked for (the
// first after a resume: a step a new generation redoes) is checked too.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/audit/step_evidence.h"
#include "runtime/base/errors.h"
#include "runtime/comm/control_group.h"

namespace lockstep {

// Who checks whom at the c-th check: arithmetic only, the same on every rank.
struct CheckRotation {
  int world = 2;
  int64_t per_rank = 1;  // microbatches each rank computes in a step
  // The rank whose microbatch `checker` recomputes (never itself; a
  // permutation of the ranks for every c).
  int owner_checked_by(int checker, int64_t c) const {
    return int((checker + 1 + c % (world - 1)) % world);
  }
  // The index in the step of the microbatch of `owner` that is checked.
  int64_t microbatch_of(int owner, int64_t c) const { return int64_t(owner) * per_rank + c % per_rank; }
};

// A microbatch whose recomputation differs from its owner's.
struct Miscompute {
  int64_t step = 0, microbatch = 0;
  int owner = 0, checker = 0;
  std::string owner_host, checker_host;
  bool loss_differs = false;
  double owner_loss = 0, checker_loss = 0;
  std::vector<std::string> tensors;  // "fc1.weight: 1 of 100352 elements, max |diff| 2.3e-10 at 0"
  std::string describe() const;
};

// Thrown on every rank under audit.on_miscompute = exclude: the job goes on
// without `host`, from the state before the step.
class MiscomputeExcluded : public RunError {
 public:
  MiscomputeExcluded(const std::string& what, std::string host, int owner)
      : RunError(what), host(std::move(host)), owner(owner) {}
  std::string host;
  int owner;
};

class CrossChecker {
 public:
  // `hosts`: each rank's host name; `tensor_names`: the parameters, in the
  // order of MicrobatchDigest::tensors. `every` 0: no step is due.
  CrossChecker(ControlGroup& control, int rank, int world_size, int64_t per_rank, int64_t every,
               std::vector<std::string> hosts, std::vector<std::string> tensor_names);

  // Whether step `step` (1-based) is checked: every `every` steps, or asked for.
  bool due(int64_t step) const;
  void also_check(int64_t step) { asked_.insert(step); }
  // At a due step: the microbatch (its index in the step) this rank
  // recomputes, and the one of its own that another rank recomputes.
  int64_t to_recompute(int64_t step) const;
  int64_t own_checked(int64_t step) const;

  // Every rank together at a due step. `own`: the digests and gradients of
  // this rank's microbatch own_checked(step); `recomputed`: this rank's
  // recomputation of to_recompute(step). Returns every mismatch of the
  // step, the same list on every rank (with each differing tensor's size
  // of difference: the owner sends those tensors to the checker).
  std::vector<Miscompute> compare(const MicrobatchDigest& own, const std::vector<at::Tensor>& own_gradients,
                                  const MicrobatchDigest& recomputed,
                                  const std::vector<at::Tensor>& recomputed_gradients);

 private:
  int64_t check_number(int64_t step) const;

  ControlGroup& control_;
  int rank_, world_;
  CheckRotation rotation_;
  int64_t every_;
  std::vector<std::string> hosts_, names_;
  std::set<int64_t> asked_;
};

}  // namespace lockstep

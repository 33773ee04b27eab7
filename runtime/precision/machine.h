#pragma once
// What this machine and this build can do, resolved against what the job
// asked for. Intent (device = auto|cpu|gpu) is kept apart from the result;
// each resolution is recorded as a Decision. Asking for what the machine or
// the build cannot give is an InputError, never a quiet fallback.
#include <string>

#include "runtime/job/config.h"
#include "runtime/run/decisions.h"

namespace lockstep {

struct BlasInfo {
  std::string library;  // resolved path of the BLAS shared object in this process
  std::string kind;     // openblas | mkl | blis | reference | unknown
};

// Reads this process's memory map to find the BLAS LibTorch really loaded.
BlasInfo loaded_blas();

// What this process may use of the CPUs, as the operating system and the
// user limit it. Read once per process.
struct CpuBudget {
  int online = 1;           // CPUs of the machine
  int affinity = 1;         // CPUs in this process's affinity mask (taskset, Slurm, ...)
  double quota = 0;         // cgroup CPU quota in CPUs (Kubernetes limits); 0 = none
  int omp_num_threads = 0;  // OMP_NUM_THREADS the user set; 0 = unset
  // Reads sched_getaffinity, the cgroup's cpu.max (v2) or cfs quota (v1),
  // and OMP_NUM_THREADS. Throws InputError for an OMP_NUM_THREADS that is
  // not a positive integer.
  static CpuBudget of_this_process();
  // The CPUs the process may keep busy: affinity and quota, at least 1.
  int usable() const;
};

struct ResolvedMachine {
  std::string device;       // cpu | cuda:N
  std::string backend;      // data-group backend: gloo | nccl
  std::string precision;    // fp32 | bf16 (autocast) | fp16 (CUDA, with the gradient scaler)
  int intra_op_threads = 1;
};

// Refuses, without touching anything, what this build can never give:
// device = gpu without CUDA, comm.backend = nccl without NCCL, fp16
// without CUDA, bf16 on a CPU that only emulates it (unless allowed).
// Throws InputError naming the key and what is allowed.
void check_machine_request(const JobConfig& config);
// The devices the job asks for against those this process sees: on a CUDA
// build, device = gpu or precision = fp16 with no CUDA device visible is
// InputError (a CPU build's refusals are check_machine_request's).
void check_devices_visible(const JobConfig& config);

// The intra-op threads of one rank, with the reason: job.threads_per_rank
// when set (warned when it exceeds the budget), else the usable CPUs over
// the local ranks, never above OMP_NUM_THREADS.
int threads_per_rank(const JobConfig& config, const CpuBudget& budget, int local_world_size,
                     std::string* reason, bool* oversubscribed);

// glibc malloc's thresholds set with mallopt (or left as the environment
// sets them), said as the `malloc` decision.
void settle_malloc(DecisionLog& log);

// Resolves device, backend, precision and threads for one rank, records a
// Decision for each (and for the BLAS), and applies the thread count.
ResolvedMachine resolve_machine(const JobConfig& config, int local_rank, int local_world_size,
                                const CpuBudget& budget, DecisionLog& log);

}  // namespace lockstep

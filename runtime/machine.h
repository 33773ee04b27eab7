#pragma once
// What this machine and this build can do, resolved against what the job
// asked for. Intent (device = auto|cpu|gpu) is kept apart from the result;
// each resolution is recorded as a Decision. Asking for what the machine or
// the build cannot give is an InputError, never a quiet fallback.
#include <string>

#include "runtime/config.h"
#include "runtime/decisions.h"

namespace lockstep {

struct BlasInfo {
  std::string library;  // resolved path of the BLAS shared object in this process
  std::string kind;     // openblas | mkl | blis | reference | unknown
};

// Reads this process's memory map to find the BLAS LibTorch really loaded.
BlasInfo loaded_blas();

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

// Resolves device, backend, precision and threads for one rank, records a
// Decision for each (and for the BLAS), and applies the thread count.
ResolvedMachine resolve_machine(const JobConfig& config, int local_rank, int local_world_size,
                                DecisionLog& log);

}  // namespace lockstep

#include "runtime/machine.h"

#include <fstream>
#include <thread>

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include "lockstep/build_config.h"
#include "runtime/errors.h"

namespace lockstep {
namespace {

std::string classify_blas(const std::string& path) {
  if (path.find("openblas") != std::string::npos) return "openblas";
  if (path.find("mkl") != std::string::npos) return "mkl";
  if (path.find("blis") != std::string::npos) return "blis";
  if (path.find("atlas") != std::string::npos) return "atlas";
  if (path.find("/blas/") != std::string::npos) return "reference";
  return "unknown";
}

std::string resolve_device(const JobConfig& config, int local_rank, DecisionLog& log) {
  const bool cuda_built = LOCKSTEP_HAS_CUDA;
  const bool cuda_usable = cuda_built && torch::cuda::is_available();
  if (config.device == "gpu" && !cuda_usable)
    throw InputError("device = gpu, but no CUDA device is visible to this process; "
                     "use device = cpu (or auto), or check CUDA_VISIBLE_DEVICES and the driver");
  if (config.device == "cpu") {
    log.record("device", "cpu", "job asked for device = cpu");
    return "cpu";
  }
  if (cuda_usable) {
    int index = local_rank % int(torch::cuda::device_count());
    std::string device = "cuda:" + std::to_string(index);
    log.record("device", device,
               "device = " + config.device + ", CUDA available; local rank " +
                   std::to_string(local_rank) + " takes GPU " + std::to_string(index));
    return device;
  }
  log.record("device", "cpu",
             cuda_built ? "device = auto and no CUDA device is visible"
                        : "device = auto and this build's LibTorch has no CUDA");
  return "cpu";
}

}  // namespace

BlasInfo loaded_blas() {
  std::ifstream maps("/proc/self/maps");
  std::string line, fallback;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    std::string base = path.substr(path.rfind('/') + 1);
    if (base.rfind("libblas", 0) == 0) return {path, classify_blas(path)};
    if (fallback.empty() && (base.rfind("libopenblas", 0) == 0 || base.rfind("libmkl", 0) == 0))
      fallback = path;
  }
  if (!fallback.empty()) return {fallback, classify_blas(fallback)};
  return {"", "unknown"};
}

void check_machine_request(const JobConfig& config) {
  if (config.device == "gpu" && !LOCKSTEP_HAS_CUDA)
    throw InputError(
        "device = gpu, but this lockstep is built against a LibTorch without CUDA; "
        "use device = cpu (or auto), or rebuild against a CUDA LibTorch");
  if (config.comm.backend == "nccl")
    throw InputError("comm.backend = nccl, but the NCCL data group is not compiled into this "
                     "lockstep (built against a LibTorch without NCCL); use comm.backend = gloo "
                     "or auto");
  if (config.precision == "bf16" || config.precision == "fp16")
    throw InputError("precision = " + config.precision +
                     " is not available in this build: only fp32 training is implemented so far "
                     "(allowed now: auto, fp32)");
}

ResolvedMachine resolve_machine(const JobConfig& config, int local_rank, int local_world_size,
                                DecisionLog& log) {
  check_machine_request(config);
  ResolvedMachine machine;
  machine.device = resolve_device(config, local_rank, log);
  machine.backend = "gloo";
  log.record("comm.backend", "gloo",
             config.comm.backend == "gloo" ? "job asked for gloo"
                                           : "auto: the NCCL data group is not compiled in, Gloo "
                                             "serves " + machine.device + " tensors");

  machine.precision = "fp32";
  log.record("precision", "fp32",
             config.precision == "fp32" ? "job asked for fp32"
                                        : "auto: this build trains in fp32 only");

  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  machine.intra_op_threads = std::max(1, int(cores) / std::max(1, local_world_size));
  at::set_num_threads(machine.intra_op_threads);
  log.record("intra_op_threads", std::to_string(machine.intra_op_threads),
             std::to_string(cores) + " cores / " + std::to_string(local_world_size) +
                 " local ranks");

  BlasInfo blas = loaded_blas();
  if (blas.kind == "reference") {
    log.record("blas", blas.kind + " (" + blas.library + ")",
               "the reference BLAS is loaded: linear layers run about ten times slower; install "
               "libopenblas0-pthread (deploy/install-deps.sh does)",
               /*warn=*/true);
  } else {
    log.record("blas", blas.kind + " (" + (blas.library.empty() ? "none found" : blas.library) + ")",
               "the BLAS library this process loaded, read from /proc/self/maps",
               blas.kind == "unknown");
  }
  return machine;
}

}  // namespace lockstep

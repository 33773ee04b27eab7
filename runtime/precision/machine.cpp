#include "runtime/precision/machine.h"

#include <dlfcn.h>
#include <malloc.h>
#include <sched.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <optional>
#include <thread>

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>
#include <ATen/Version.h>
#include <torch/cuda.h>

#include "lockstep/build_config.h"
#if LOCKSTEP_HAS_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif
#include "runtime/base/errors.h"
#include "runtime/precision/probe.h"

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

// How many local ranks share each GPU when `local_world_size` ranks on
// this host split `gpus` visible ones (1: a GPU each).
int ranks_per_gpu(int local_world_size, int gpus) {
  return gpus > 0 ? (std::max(1, local_world_size) + gpus - 1) / gpus : 1;
}

std::string resolve_device(const JobConfig& config, int local_rank, int local_world_size, DecisionLog& log) {
  const bool cuda_built = LOCKSTEP_HAS_CUDA;
  const bool cuda_usable = cuda_built && torch::cuda::is_available();
  check_devices_visible(config);  // device = gpu without a visible GPU
  if (config.device == "cpu") {
    log.record("device", "cpu", "job asked for device = cpu");
    return "cpu";
  }
  if (cuda_usable) {
    const int gpus = int(torch::cuda::device_count());
    const int index = local_rank % gpus;
    const std::string device = "cuda:" + std::to_string(index);
#if LOCKSTEP_HAS_CUDA
    c10::cuda::set_device(c10::DeviceIndex(index));  // this process's allocations and NCCL's communicator
#endif
    const int sharing = ranks_per_gpu(local_world_size, gpus);
    log.record("device", device,
               "device = " + config.device + ": " + std::to_string(gpus) + " CUDA device(s) visible, " +
                   std::to_string(local_world_size) + " rank(s) on this host; LOCAL_RANK " +
                   std::to_string(local_rank) + " takes GPU " + std::to_string(index) +
                   (sharing > 1 ? " (" + std::to_string(sharing) + " ranks share each GPU: they "
                                  "take turns on it, and NCCL cannot serve them)"
                                : ""),
               /*warn=*/sharing > 1);
    return device;
  }
  log.record("device", "cpu",
             cuda_built ? "device = auto and no CUDA device is visible"
                        : "device = auto and this build's LibTorch has no CUDA");
  return "cpu";
}

// The data group's backend for a rank on `device`: NCCL for a GPU of its
// own, Gloo on the CPU and where ranks share a GPU (NCCL refuses two ranks
// of one communicator on one device; Gloo reduces CUDA tensors through the host).
std::string resolve_backend(const JobConfig& config, const std::string& device, int local_world_size,
                            DecisionLog& log) {
  const std::string& asked = config.comm.backend;
  if (device == "cpu") {
    if (asked == "nccl")
      throw InputError("comm.backend = nccl reduces CUDA tensors only, and this rank trains on the "
                       "CPU (see the device decision); use comm.backend = gloo or auto, or device = gpu "
                       "on a machine with a GPU");
    log.record("comm.backend", "gloo",
               asked == "gloo" ? "job asked for gloo"
                               : "auto: this rank trains on the CPU, and Gloo serves CPU tensors");
    return "gloo";
  }
  const int gpus = LOCKSTEP_HAS_CUDA ? int(torch::cuda::device_count()) : 0;
  const int sharing = ranks_per_gpu(local_world_size, gpus);
  if (sharing > 1) {
    const std::string why = std::to_string(local_world_size) + " ranks on this host share " +
                            std::to_string(gpus) + " GPU(s), and NCCL refuses two ranks of one "
                            "communicator on the same device";
    if (asked == "nccl")
      throw InputError("comm.backend = nccl, but " + why + "; use comm.backend = gloo or auto (Gloo "
                       "reduces the CUDA tensors through host memory), or start at most one rank per GPU");
    log.record("comm.backend", "gloo",
               (asked == "gloo" ? std::string("job asked for gloo") : "auto: " + why) +
                   "; Gloo all-reduces the CUDA gradients through host memory", /*warn=*/asked != "gloo");
    return "gloo";
  }
  if (asked == "gloo") {
    log.record("comm.backend", "gloo", "job asked for gloo: CUDA gradients go through host memory "
               "(NCCL would keep them on the GPUs)", /*warn=*/true);
    return "gloo";
  }
  log.record("comm.backend", "nccl",
             (asked == "nccl" ? "job asked for nccl" : "auto: this rank has " + device + " to itself") +
                 "; the control group stays on Gloo with CPU tensors");
  return "nccl";
}

std::string ratio_text(const std::optional<double>& ratio) {
  return ratio ? fmt::format("{:.2f}x", *ratio) : std::string("no figure");
}

// The probe's figures for bf16 on the CPU (measured now or cached), with a
// sentence that says them and where they came from.
struct Bf16Figures {
  std::optional<double> matmul, conv;  // bf16 speed / fp32 speed
  std::string text;
  bool faster() const { return matmul && conv && *matmul > 1 && *conv > 1; }
  bool slower() const { return (matmul && *matmul < 1) || (conv && *conv < 1); }
};

Bf16Figures cpu_bf16_figures() {
  std::string why;
  const ProbeTable table = load_or_run_probe(this_executable(), false, &why);
  Bf16Figures figures{table.ratio("cpu", "bf16", "matmul"), table.ratio("cpu", "bf16", "conv"), ""};
  figures.text = "the probe measured bf16 at " + ratio_text(figures.matmul) +
                 " fp32's speed for matmul and " + ratio_text(figures.conv) +
                 " for conv, forward + backward (" + why + ")";
  return figures;
}

std::string resolve_precision(const JobConfig& config, const std::string& device, DecisionLog& log) {
  const std::string& asked = config.precision.dtype;
  if (asked == "fp32") {
    log.record("precision", "fp32", "job asked for fp32");
    return "fp32";
  }
  if (device != "cpu") {  // CUDA: capability from the device properties, not an allocation test
    const auto gpus = cuda_devices();
    const int index = std::stoi(device.substr(device.find(':') + 1));
    const int major = index < int(gpus.size()) ? gpus[size_t(index)].value("major", 0) : 0;
    const std::string where = fmt::format("{} has compute capability {}.x", device, major);
    if (asked == "fp16") {
      log.record("precision", "fp16", "job asked for fp16 on " + device + " (with the gradient scaler)");
      return "fp16";
    }
    if (major >= 8) {
      log.record("precision", "bf16", (asked == "auto" ? "auto: " : "job asked for bf16; ") + where + " (>= 8: native bf16)");
      return "bf16";
    }
    if (asked == "bf16" && !config.precision.allow_emulated)
      throw InputError("precision = bf16, but " + where + " (< 8): bf16 is emulated there; use "
                       "fp16 or fp32, or set precision.allow_emulated = true");
    if (asked == "bf16") {
      log.record("precision", "bf16", "precision.allow_emulated: " + where + ", bf16 is emulated", true);
      return "bf16";
    }
    log.record("precision", "fp32", "auto: " + where + " (< 8: no native bf16; fp16 is yours to ask for)");
    return "fp32";
  }
  if (asked == "fp16")  // device = auto chose the CPU (the device decision says why)
    throw InputError("precision = fp16 runs only on CUDA (CPU autocast has bf16 only), and this rank "
                     "trains on the CPU (see the device decision); use precision = bf16, fp32 or auto");
  const std::string flags = native_bf16_cpu_flags();
  if (asked == "bf16") {
    const Bf16Figures figures = cpu_bf16_figures();
    if (flags.empty())  // allow_emulated (check_machine_request refused the rest)
      log.record("precision", "bf16", "precision.allow_emulated = true: this CPU has no native bf16 "
                 "and emulates it; " + figures.text, /*warn=*/true);
    else
      log.record("precision", "bf16", "job asked for bf16; native on this CPU (" + flags + "); " +
                 figures.text, figures.slower());
    return "bf16";
  }
  // auto
  if (flags.empty()) {
    log.record("precision", "fp32", "auto: this CPU has no native bf16 (no avx512_bf16 or amx_bf16 flag)");
    return "fp32";
  }
  const Bf16Figures figures = cpu_bf16_figures();
  if (figures.faster()) {
    log.record("precision", "bf16", "auto: native on this CPU (" + flags + ") and faster: " + figures.text);
    return "bf16";
  }
  log.record("precision", "fp32", "auto: bf16 is native on this CPU (" + flags + ") but not faster "
             "for both: " + figures.text + "; ask for precision = bf16 to use it anyway");
  return "fp32";
}

// cgroup v2: the smallest cpu.max quota on the path from this process's
// cgroup to the root; v1: cpu.cfs_quota_us / cpu.cfs_period_us. 0 = none.
double cgroup_cpu_quota() {
  std::ifstream cgroups("/proc/self/cgroup");
  double smallest = 0;
  for (std::string line; std::getline(cgroups, line);) {
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    std::string path = line.substr(second + 1);
    auto consider = [&](double cpus) {
      if (cpus > 0 && (smallest == 0 || cpus < smallest)) smallest = cpus;
    };
    if (controllers.empty()) {  // v2
      for (;;) {
        std::ifstream max("/sys/fs/cgroup" + path + "/cpu.max");
        std::string quota;
        double period = 0;
        if (max >> quota >> period && quota != "max" && period > 0) consider(std::stod(quota) / period);
        if (path.empty() || path == "/") break;
        path = path.substr(0, path.rfind('/'));
      }
    } else if (controllers.find("cpu") != std::string::npos &&
               controllers.find("cpuset") == std::string::npos) {  // v1
      for (const std::string mount : {"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"}) {
        std::ifstream quota_file(mount + path + "/cpu.cfs_quota_us");
        std::ifstream period_file(mount + path + "/cpu.cfs_period_us");
        double quota = 0, period = 0;
        if (quota_file >> quota && period_file >> period && quota > 0 && period > 0) {
          consider(quota / period);
          break;
        }
      }
    }
  }
  return smallest;
}

}  // namespace

CpuBudget CpuBudget::of_this_process() {
  CpuBudget budget;
  budget.online = std::max(1, int(std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  budget.affinity = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : budget.online;
  budget.quota = cgroup_cpu_quota();
  if (const char* text = std::getenv("OMP_NUM_THREADS"); text && *text) {
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (*end != '\0' || value < 1 || value > 4096)
      throw InputError("environment variable OMP_NUM_THREADS = '" + std::string(text) +
                       "' must be an integer in [1, 4096] (or unset; job.threads_per_rank sets "
                       "the threads per rank for the whole job)");
    budget.omp_num_threads = int(value);
  }
  return budget;
}

int CpuBudget::usable() const {
  int cpus = std::max(1, affinity);
  if (quota > 0) cpus = std::min(cpus, std::max(1, int(std::floor(quota))));
  return cpus;
}

int threads_per_rank(const JobConfig& config, const CpuBudget& budget, int local_world_size,
                     std::string* reason, bool* oversubscribed) {
  const int locals = std::max(1, local_world_size);
  std::ostringstream limits;
  limits << budget.affinity << " of " << budget.online << " CPUs in this process's affinity";
  if (budget.quota > 0) limits << ", cgroup quota " << budget.quota << " CPUs";
  const int share = std::max(1, budget.usable() / locals);
  *oversubscribed = false;
  if (config.job.threads_per_rank > 0) {
    const int threads = int(config.job.threads_per_rank);
    *oversubscribed = int64_t(threads) * locals > budget.usable();
    *reason = "job.threads_per_rank = " + std::to_string(threads) +
              (*oversubscribed ? "; more than this process's share (" + limits.str() + ", " +
                                     std::to_string(locals) + " local ranks: " +
                                     std::to_string(share) + " each): threads will wait on each other"
                               : "; the same on every host, so placement does not change the bits");
    return threads;
  }
  int threads = share;
  std::string why = limits.str() + " / " + std::to_string(locals) + " local ranks";
  if (budget.omp_num_threads > 0 && budget.omp_num_threads < threads) {
    threads = budget.omp_num_threads;
    why += ", capped by OMP_NUM_THREADS = " + std::to_string(budget.omp_num_threads);
  }
  *reason = why + "; job.threads_per_rank = 0 (derived): the thread count is the one thing that ties "
                  "the bits to the placement (kernels sum in an order set by it); set "
                  "job.threads_per_rank for the same bits on any world size and host";
  return threads;
}

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
  // No BLAS library of its own in the process: PyPI's LibTorch links MKL
  // statically into libtorch_cpu.so, and says so in its build settings.
  const std::string config = at::show_config();
  const std::string key = "BLAS_INFO=";
  if (const auto at = config.find(key); at != std::string::npos) {
    const auto end = config.find_first_of(", \n", at + key.size());
    const std::string kind = config.substr(at + key.size(), end - at - key.size());
    if (!kind.empty()) return {"linked into LibTorch", classify_blas(kind) == "unknown" ? kind : classify_blas(kind)};
  }
  return {"", "unknown"};
}

void check_devices_visible(const JobConfig& config) {
  if (!LOCKSTEP_HAS_CUDA || torch::cuda::is_available()) return;  // check_machine_request covers a CPU build
  if (config.device == "gpu")
    throw InputError("device = gpu, but no CUDA device is visible to this process (this lockstep has CUDA: "
                     "LibTorch " LOCKSTEP_TORCH_VERSION "); use device = cpu (or auto), or check "
                     "CUDA_VISIBLE_DEVICES and the driver");
  if (config.precision.dtype == "fp16")
    throw InputError("precision = fp16 runs only on CUDA (with the gradient scaler), and no CUDA "
                     "device is visible to this process; use precision = bf16, fp32 or auto");
  if (config.comm.backend == "nccl")
    throw InputError("comm.backend = nccl reduces CUDA tensors only, and no CUDA device is visible "
                     "to this process; use comm.backend = gloo or auto");
}

void check_machine_request(const JobConfig& config) {
  if (config.device == "gpu" && !LOCKSTEP_HAS_CUDA)
    throw InputError(
        "device = gpu, but this lockstep is built against a LibTorch without CUDA; "
        "use device = cpu (or auto), or rebuild against a CUDA LibTorch");
  if (config.comm.backend == "nccl" && !LOCKSTEP_HAS_CUDA)
    throw InputError("comm.backend = nccl, but the NCCL data group is not compiled into this "
                     "lockstep (built against a LibTorch without CUDA and NCCL); use comm.backend = "
                     "gloo or auto");
  if (config.comm.backend == "nccl" && config.device == "cpu")
    throw InputError("comm.backend = nccl reduces CUDA tensors only, and the job asks for device = "
                     "cpu; use comm.backend = gloo or auto");
  const std::string& dtype = config.precision.dtype;
  if (dtype == "fp16" && !LOCKSTEP_HAS_CUDA)
    throw InputError("precision = fp16 runs only on CUDA (LibTorch 1.13's CPU autocast has bf16 "
                     "only), and this lockstep is built against a LibTorch without CUDA; use "
                     "precision = bf16, fp32 or auto");
  if (dtype == "fp16" && config.device == "cpu")
    throw InputError("precision = fp16 runs only on CUDA, and the job asks for device = cpu; use "
                     "precision = bf16, fp32 or auto");
  if (dtype == "bf16" && !LOCKSTEP_HAS_CUDA && native_bf16_cpu_flags().empty() &&
      !config.precision.allow_emulated)
    throw InputError("precision = bf16, but this CPU has no native bf16 (neither avx512_bf16 nor "
                     "amx_bf16 in /proc/cpuinfo): LibTorch would emulate it, usually slower than "
                     "fp32; use fp32 or auto, or set precision.allow_emulated = true to run it "
                     "anyway (warned, with the measured slowdown)");
}

void settle_malloc(DecisionLog& log) {
  // glibc's default thresholds hand a freed block of more than 128 KiB
  // (growing with use, up to 32 MiB) back to the kernel, and trim the heap
  // above 128 KiB free: a training step frees and takes back its
  // activations every step, and the page faults of taking them back can
  // cost more than the step's arithmetic. Fixed thresholds make the speed
  // independent of the allocation pattern of the day.
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD"})
    if (const char* set = std::getenv(name); set && *set) {
      log.record("malloc", "as the environment sets it",
                 std::string(name) + " = " + set + ": lockstep leaves the allocator's thresholds alone");
      return;
    }
  constexpr int kMmapThreshold = 32 << 20;  // glibc's largest on 64-bit
  constexpr int kTrimThreshold = 1 << 30;
  const bool mmap_set = ::mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1;
  const bool trim_set = ::mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
  log.record("malloc", mmap_set && trim_set ? "mmap threshold 32 MiB, trim threshold 1 GiB" : "glibc's defaults",
             mmap_set && trim_set
                 ? "mallopt at start: blocks up to 32 MiB (a step's activations) come from the heap and "
                   "freed memory is kept for the next step instead of returned to the kernel and faulted "
                   "in again (set MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ to choose others)"
                 : "mallopt refused the thresholds: freed activations go back to the kernel every step",
             /*warn=*/!(mmap_set && trim_set));
}

ResolvedMachine resolve_machine(const JobConfig& config, int local_rank, int local_world_size,
                                const CpuBudget& budget, DecisionLog& log) {
  check_machine_request(config);
  ResolvedMachine machine;
  machine.device = resolve_device(config, local_rank, local_world_size, log);
  machine.backend = resolve_backend(config, machine.device, local_world_size, log);

  machine.precision = resolve_precision(config, machine.device, log);

  std::string why;
  bool oversubscribed = false;
  machine.intra_op_threads = threads_per_rank(config, budget, local_world_size, &why, &oversubscribed);
  at::set_num_threads(machine.intra_op_threads);
  log.record("intra_op_threads", std::to_string(machine.intra_op_threads), why, oversubscribed);

  // OpenBLAS keeps its own thread pool, sized from OPENBLAS_NUM_THREADS when
  // it loaded (all cores if unset): sized here like the intra-op threads, so
  // a rank computes the same bits however it was started.
  using SetThreads = void (*)(int);
  if (auto set_blas_threads = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set_blas_threads(machine.intra_op_threads);
    log.record("blas_threads", std::to_string(machine.intra_op_threads),
               "openblas_set_num_threads, like intra_op_threads: the same summation order whether "
               "OPENBLAS_NUM_THREADS was set or not");
  }

  settle_malloc(log);

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

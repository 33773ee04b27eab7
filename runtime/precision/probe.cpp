#include "runtime/precision/probe.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "lockstep/build_config.h"
#if LOCKSTEP_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif
#include "runtime/base/errors.h"
#include "runtime/run/run_folder.h"
#include "runtime/base/untrusted_json.h"

extern char** environ;

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

std::string cpuinfo_field(const std::string& name) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(name, 0) == 0 && line.find(':') != std::string::npos) {
      std::string value = line.substr(line.find(':') + 1);
      return value.substr(value.find_first_not_of(' '));
    }
  return "";
}

std::set<std::string> cpu_flags() {
  std::set<std::string> flags;
  std::istringstream in(cpuinfo_field("flags"));
  for (std::string flag; in >> flag;) flags.insert(flag);
  return flags;
}

at::ScalarType scalar_type(const std::string& dtype) {
  if (dtype == "bf16") return at::kBFloat16;
  if (dtype == "fp16") return at::kHalf;
  return at::kFloat;
}

// Repeats `once` (returning its flops) for about `seconds`, after a warm-up.
double tflops_of(const std::function<double()>& once, double seconds, const std::string& device) {
  once();
  double flops = 0;
  const auto start = Clock::now();
  do {
    flops += once();
    if (device != "cpu") torch::cuda::synchronize();
  } while (std::chrono::duration<double>(Clock::now() - start).count() < seconds);
  return flops / std::chrono::duration<double>(Clock::now() - start).count() / 1e12;
}

// Runs `lockstep probe --candidate DEVICE:DTYPE` and reads its rows; a
// crash or a timeout becomes an error row per op.
std::vector<ProbeRow> run_candidate(const std::string& executable, const std::string& device,
                                    const std::string& dtype) {
  auto failed = [&](const std::string& why) {
    std::vector<ProbeRow> rows;
    for (const char* op : {"matmul", "conv"}) rows.push_back({device, dtype, op, 0, why});
    return rows;
  };
  char out_path[] = "/tmp/lockstep-probe-XXXXXX";
  int fd = ::mkstemp(out_path);
  if (fd < 0) return failed("cannot create a temporary file");
  ::close(fd);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path, O_WRONLY | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> args = {executable, "probe", "--candidate", device + ":" + dtype};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int error = posix_spawn(&pid, executable.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    std::filesystem::remove(out_path);
    return failed("cannot start " + executable + ": " + std::strerror(error));
  }
  int status = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      std::filesystem::remove(out_path);
      return failed("timed out after 60 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ifstream in(out_path);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(out_path);
  if (WIFSIGNALED(status))
    return failed(fmt::format("the probe crashed (signal {}: {})", WTERMSIG(status), strsignal(WTERMSIG(status))));
  auto rows_json = nlohmann::json::parse(text.str(), nullptr, false);
  if (rows_json.is_discarded() || !rows_json.is_array())
    return failed(fmt::format("the probe exited with status {} and no table",
                              WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  std::vector<ProbeRow> rows;
  for (const auto& r : rows_json)
    rows.push_back({r.value("device", device), r.value("dtype", dtype), r.value("op", ""),
                    r.value("tflops", 0.0), r.value("error", "")});
  return rows;
}

// Which fields differ, for the log: "cpu_model: A -> B".
std::string fingerprint_change(const nlohmann::json& before, const nlohmann::json& now) {
  std::string out;
  for (const auto& [key, value] : now.items())
    if (!before.contains(key) || before[key] != value)
      out += (out.empty() ? "" : "; ") + key + ": " +
             (before.contains(key) ? before[key].dump() : "none") + " -> " + value.dump();
  return out.empty() ? "the cache has another layout" : out;
}

}  // namespace

std::optional<double> ProbeTable::ratio(const std::string& device, const std::string& dtype,
                                        const std::string& op) const {
  double base = 0, value = 0;
  for (const auto& r : rows) {
    if (r.device != device || r.op != op || !r.error.empty()) continue;
    if (r.dtype == "fp32") base = r.tflops;
    if (r.dtype == dtype) value = r.tflops;
  }
  if (base <= 0 || value <= 0) return std::nullopt;
  return value / base;
}

std::string ProbeTable::text() const {
  std::string out = fmt::format("{:<8} {:<6} {:<7} {:>10} {:>9}  {}\n", "device", "dtype", "op",
                                "TFLOP/s", "vs fp32", "note");
  for (const auto& r : rows) {
    auto vs = ratio(r.device, r.dtype, r.op);
    out += fmt::format("{:<8} {:<6} {:<7} {:>10} {:>9}  {}\n", r.device, r.dtype, r.op,
                       r.error.empty() ? fmt::format("{:.3f}", r.tflops) : "-",
                       vs ? fmt::format("{:.2f}x", *vs) : "-", r.error);
  }
  return out;
}

nlohmann::json ProbeTable::to_json() const {
  nlohmann::json rows_json = nlohmann::json::array();
  for (const auto& r : rows)
    rows_json.push_back({{"device", r.device}, {"dtype", r.dtype}, {"op", r.op},
                         {"tflops", r.tflops}, {"error", r.error}});
  return {{"fingerprint", fingerprint}, {"rows", rows_json}, {"measured_at", measured_at},
          {"seconds", seconds}};
}

ProbeTable ProbeTable::from_json(const nlohmann::json& json) {
  ProbeTable table;
  table.fingerprint = json.value("fingerprint", nlohmann::json::object());
  table.measured_at = json.value("measured_at", "");
  table.seconds = json.value("seconds", 0.0);
  for (const auto& r : json.value("rows", nlohmann::json::array()))
    table.rows.push_back({r.value("device", ""), r.value("dtype", ""), r.value("op", ""),
                          r.value("tflops", 0.0), r.value("error", "")});
  return table;
}

nlohmann::json cuda_devices() {
  nlohmann::json gpus = nlohmann::json::array();
#if LOCKSTEP_HAS_CUDA
  int driver = 0;
  cudaDriverGetVersion(&driver);
  for (int i = 0; torch::cuda::is_available() && i < int(torch::cuda::device_count()); ++i) {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(i);
    gpus.push_back({{"index", i}, {"name", p->name}, {"major", p->major}, {"minor", p->minor},
                    {"driver", driver}});
  }
#endif
  return gpus;
}

std::string native_bf16_cpu_flags() {
  std::string out;
  for (const auto& flag : cpu_flags())
    if (flag == "avx512_bf16" || flag == "amx_bf16") out += (out.empty() ? "" : ", ") + flag;
  return out;
}

nlohmann::json machine_fingerprint() {
  nlohmann::json flags = nlohmann::json::array();
  for (const auto& flag : cpu_flags())
    if (flag == "avx2" || flag == "fma" || flag.rfind("avx512", 0) == 0 || flag.rfind("amx", 0) == 0)
      flags.push_back(flag);
  return {{"cpu_model", cpuinfo_field("model name")}, {"cpu_flags", flags},
          {"cores", std::thread::hardware_concurrency()}, {"gpus", cuda_devices()},
          {"libtorch", TORCH_VERSION}, {"lockstep", LOCKSTEP_VERSION}};
}

std::string this_executable() {
  std::error_code error;
  auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? "lockstep" : self.string();
}

std::string probe_cache_path() { return cache_folder() + "/probe.json"; }

std::vector<ProbeRow> measure_candidate(const std::string& device, const std::string& dtype,
                                        double seconds) {
  std::vector<ProbeRow> rows;
  const auto options = torch::TensorOptions().dtype(scalar_type(dtype)).device(device);
  auto measure = [&](const std::string& op, const std::function<double()>& once) {
    ProbeRow row{device, dtype, op};
    try {
      row.tflops = tflops_of(once, seconds, device);
    } catch (const std::exception& e) {
      std::string what = e.what();
      row.error = what.substr(0, what.find('\n'));  // LibTorch appends a backtrace
    }
    rows.push_back(row);
  };
  const int64_t n = 512;
  auto a = torch::randn({n, n}, options).requires_grad_(true);
  auto b = torch::randn({n, n}, options).requires_grad_(true);
  measure("matmul", [&] {
    torch::matmul(a, b).sum().backward();
    return 3.0 * 2.0 * double(n * n * n);  // forward and two backward products
  });
  const int64_t batch = 16, in_c = 32, out_c = 64, side = 28;
  auto x = torch::randn({batch, in_c, side, side}, options).requires_grad_(true);
  auto w = torch::randn({out_c, in_c, 3, 3}, options).requires_grad_(true);
  measure("conv", [&] {
    torch::conv2d(x, w, {}, 1, 1).sum().backward();
    return 3.0 * 2.0 * double(batch * out_c * side * side * in_c * 9);
  });
  return rows;
}

ProbeTable load_or_run_probe(const std::string& executable, bool force, std::string* why) {
  const std::string path = probe_cache_path();
  std::error_code ignored;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ignored);
  // One probe at a time per cache: the other ranks of this machine wait
  // for it and then read its result.
  const std::string lock_path = path + ".lock";
  int lock = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock >= 0) ::flock(lock, LOCK_EX);
  struct Unlock {
    int fd;
    ~Unlock() {
      if (fd >= 0) ::close(fd);
    }
  } unlock{lock};

  const nlohmann::json now = machine_fingerprint();
  std::string reason = force ? "asked to (--force)" : "no cache at " + path;
  if (!force && std::filesystem::exists(path)) {
    std::ifstream in(path);
    auto cached = parse_untrusted_json(in, nullptr);
    if (cached.is_object() && cached.value("fingerprint", nlohmann::json()) == now) {
      if (why) *why = "cached in " + path + " (measured " + cached.value("measured_at", "?") + ")";
      return ProbeTable::from_json(cached);
    }
    reason = !cached.is_object() ? "the cache " + path + " is not a probe table"
                                   : "the fingerprint changed (" +
                                         fingerprint_change(cached.value("fingerprint", nlohmann::json::object()), now) + ")";
  }
  spdlog::info("probe: measuring fp32, bf16 and fp16 on this machine ({})", reason);
  const auto start = Clock::now();
  ProbeTable table;
  table.fingerprint = now;
  table.measured_at = utc_timestamp();
  std::vector<std::string> devices = {"cpu"};
#if LOCKSTEP_HAS_CUDA
  for (int i = 0; torch::cuda::is_available() && i < int(torch::cuda::device_count()); ++i)
    devices.push_back("cuda:" + std::to_string(i));
#endif
  for (const auto& device : devices)
    for (const char* dtype : {"fp32", "bf16", "fp16"})
      for (auto& row : run_candidate(executable, device, dtype)) table.rows.push_back(row);
  table.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::string stored = "stored in " + path;
  try {
    write_file_atomically(path, table.to_json().dump(2));
  } catch (const std::exception& e) {
    // The figures are good; only the next run measures again.
    spdlog::warn("probe: the figures are used but not cached ({}); the next run measures again", e.what());
    stored = "not cached: " + std::string(e.what());
  }
  if (why) *why = "measured now in " + fmt::format("{:.1f}", table.seconds) + " s: " + reason + "; " + stored;
  return table;
}

}  // namespace lockstep

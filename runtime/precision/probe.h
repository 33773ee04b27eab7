#pragma once
// What each precision really costs on this machine: matmul and conv forward
// + backward timed in fp32, bf16 and fp16 on every usable device, stored with
// a fingerprint of the hardware and software in the user's cache folder.
// precision = auto reads it; a changed fingerprint (another CPU, driver or
// LibTorch) makes it run again. Each candidate runs in a spawned child
// (`lockstep probe --candidate DEVICE:DTYPE`), so one that crashes is
// recorded as such and cannot take the caller down.
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lockstep {

struct ProbeRow {
  std::string device;  // cpu | cuda:0 ...
  std::string dtype;   // fp32 | bf16 | fp16
  std::string op;      // matmul | conv
  double tflops = 0;   // forward + backward
  std::string error;   // why there is no figure ("" = measured)
};

struct ProbeTable {
  nlohmann::json fingerprint;
  std::vector<ProbeRow> rows;
  std::string measured_at;
  double seconds = 0;  // the probe's wall time

  // dtype's speed over fp32's for `op` on `device`; nullopt without both.
  std::optional<double> ratio(const std::string& device, const std::string& dtype,
                              const std::string& op) const;
  std::string text() const;  // the table a person reads
  nlohmann::json to_json() const;
  static ProbeTable from_json(const nlohmann::json& json);
};

// CPU model and the flags that matter, GPUs (name, capability, driver),
// core count, LibTorch and lockstep versions.
nlohmann::json machine_fingerprint();
// Every visible CUDA device: index, name, capability (major, minor), driver
// version. Empty in a CPU-only build.
nlohmann::json cuda_devices();
// The bf16 instruction-set flags this CPU has ("avx512_bf16, amx_bf16"; "" = none).
std::string native_bf16_cpu_flags();
// $LOCKSTEP_CACHE_DIR, else $XDG_CACHE_HOME/lockstep, else ~/.cache/lockstep; + /probe.json.
std::string probe_cache_path();

// In this process: times `dtype` on `device` for about `seconds` per op.
std::vector<ProbeRow> measure_candidate(const std::string& device, const std::string& dtype,
                                        double seconds);

// This process's binary (/proc/self/exe): the lockstep that starts workers
// and probe candidates.
std::string this_executable();

// The cached table when its fingerprint matches this machine, else a fresh
// probe (under a lock on the cache: concurrent ranks wait for one probe),
// written to the cache. `why` says which and why. `executable` is the
// lockstep binary that runs the candidates.
ProbeTable load_or_run_probe(const std::string& executable, bool force, std::string* why);

}  // namespace lockstep

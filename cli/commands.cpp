#include "cli/commands.h"

#include "coordinator/metrics_endpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include "cli/launcher.h"
#include "runtime/startup/resume_plan.h"
#include "lockstep/build_config.h"
#include "coordinator/coordinator.h"
#include "coordinator/endpoint_checks.h"
#include "runtime/checkpoint/checkpoint_store.h"
#include "runtime/audit/audit_report.h"
#include "runtime/audit/run_compare.h"
#include "runtime/data/dataset.h"
#include "runtime/base/errors.h"
#include "runtime/run/generation.h"
#include "runtime/precision/machine.h"
#include "runtime/model/models.h"
#include "runtime/precision/probe.h"
#include "runtime/run/run_folder.h"
#include "runtime/startup/job_checks.h"
#include "runtime/startup/model_checks.h"

namespace lockstep {

void check_connection(const ConnectionFlags& connection) {
  check_host_port(connection.coordinator, "--coordinator", /*must_resolve=*/false);
  if (!connection.tls_ca.empty()) check_tls_ca(connection.tls_ca);
}

// --token-file, else LOCKSTEP_TOKEN; neither is bad input.
std::string resolve_token(const std::string& token_file) {
  if (!token_file.empty()) {
    std::string token = read_secret_file(token_file, "--token-file");
    validate_token(token, "--token-file " + token_file);
    return token;
  }
  if (const char* token = std::getenv("LOCKSTEP_TOKEN"); token && *token) {
    validate_token(token, "LOCKSTEP_TOKEN");
    return token;
  }
  throw InputError("no job token: pass --token-file FILE or set LOCKSTEP_TOKEN (coordinator and "
                   "workers need the same one)");
}

namespace {

using std::chrono::milliseconds;

milliseconds to_ms(double seconds) { return milliseconds(int64_t(seconds * 1000.0)); }

// Leaves the job's address and token in its folder for `lockstep status
// RUN_DIR`, and takes them away at the end. A failure to write only costs that.
class StatusHandle {
 public:
  StatusHandle(const std::string& folder, const std::string& address, const std::string& token)
      : folder_(folder) {
    try {
      const std::string token_path = folder + "/" + kTokenFile;
      const int fd = ::open(token_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0 || ::write(fd, token.data(), token.size()) != ssize_t(token.size()))
        throw RunError(token_path + ": " + std::strerror(errno));
      ::close(fd);
      write_file_atomically(folder + "/" + kAddressFile, address);
    } catch (const std::exception& e) {
      spdlog::warn("lockstep status {} will not find this job ({}); use --coordinator {}", folder, e.what(), address);
    }
  }
  ~StatusHandle() {
    std::error_code ignored;
    std::filesystem::remove(folder_ + "/" + kAddressFile, ignored);
    std::filesystem::remove(folder_ + "/" + kTokenFile, ignored);
  }

 private:
  std::string folder_;
};

// --metrics: the coordinator's status for Prometheus, while `coordinator` lives.
std::unique_ptr<MetricsEndpoint> serve_metrics(const std::string& address, CoordinatorServer& coordinator) {
  if (address.empty()) return nullptr;
  return std::make_unique<MetricsEndpoint>(address, [&coordinator] {
    v1::StatusReply reply;
    coordinator.job_state().status(&reply);
    return reply;
  });
}

JobStateOptions job_options(const JobConfig& config, const std::string& run_id) {
  JobStateOptions job;
  job.run_id = run_id;
  job.world_size = int(config.job.world_size);
  job.seed = config.job.seed;
  job.settings = effective_settings(config);
  job.sources = config.sources;
  job.job_file = config.job_file;
  job.rendezvous_timeout = to_ms(config.comm.rendezvous_timeout_s);
  job.heartbeat_timeout = to_ms(config.fault.heartbeat_timeout_s);
  job.heartbeat_period = to_ms(config.fault.heartbeat_s);
  job.max_restarts = int(config.fault.max_restarts);
  job.min_ranks = int(config.elastic.min_ranks);
  job.replace_wait = to_ms(config.elastic.replace_wait_s);
  job.microbatches = microbatches_per_step(config);
  job.max_host_losses = int(config.elastic.max_host_losses);
  return job;
}

}  // namespace

int run_command(const std::string& job_file, const std::vector<std::string>& overrides, int nproc,
                const std::string& resume_dir, const std::string& metrics_address) {
  std::vector<std::string> passed_on = overrides;
  const ResumePlan resume = plan_resume(resume_dir, passed_on);
  const std::string& resumed_id = resume.run_id;
  // --nproc is the world size before anything is checked against it (a
  // test.fail_rank or fault.inject rank beyond the job file's world size).
  JobConfig config;
  if (nproc > 0) {
    std::string file_says = "the same";
    try {
      if (const int64_t in_file = load_job_config(job_file, passed_on).job.world_size; in_file != nproc)
        file_says = std::to_string(in_file);
    } catch (const InputError&) {
      file_says = "one this job's ranks do not fit (a rank key names rank " "beyond it)";
    }
    if (file_says != "the same") {
      spdlog::info("Decision: job.world_size = {} (from --nproc; the job file says {})", nproc, file_says);
      passed_on.push_back("job.world_size=" + std::to_string(nproc));
    }
  }
  config = checked_job(job_file, passed_on);
  check_devices_here(config);  // the ranks run here: a GPU asked for must be here
  check_data_files(config.data, DataHost::this_host);  // a truncated file is bad input before anything starts
  if (resume_is_already_done(resume, config)) return 0;
  // The model against the data: a shape it rejects is bad input before anything starts.
  // At the precision the job names (`auto` is resolved by each worker, which runs the dry run again).
  std::string eval_precision;
  check_model_on_data(config, ModelRegistry::with_builtins(), load_data(config.data, uint64_t(config.job.seed)),
                      config.precision.dtype == "bf16" ? "bf16" : "fp32", &eval_precision);

  const std::string run_id = resumed_id.empty() ? new_run_id(config.job.name) : resumed_id;
  CoordinatorOptions coordinator_options;
  coordinator_options.listen = "127.0.0.1:0";
  const char* given_token = std::getenv("LOCKSTEP_TOKEN");
  if (given_token && *given_token) validate_token(given_token, "LOCKSTEP_TOKEN");
  coordinator_options.token = given_token && *given_token ? given_token : random_hex(16);
  spdlog::info("Decision: job token = {} ({})", given_token && *given_token ? "LOCKSTEP_TOKEN" : "generated",
               given_token && *given_token ? "set in the environment: `lockstep status` can use it"
                                           : "random per run, handed to the workers only");
  coordinator_options.run_dir = config.job.run_dir;

  LaunchOptions options;
  options.executable = this_executable();
  options.quiet = spdlog::get_level() >= spdlog::level::warn;  // lockstep run --quiet
  options.token = coordinator_options.token;
  options.nproc = int(config.job.world_size);
  options.terminal = ::isatty(STDOUT_FILENO);

  JobStateOptions job = job_options(config, run_id);
  // Every worker is a child of this process: one the coordinator declares
  // dead (silent, not exited) is killed so that a replacement can take its place.
  job.on_rank_declared_dead = [](int pid) {
    spdlog::warn("launcher: SIGKILL to pid {}, declared dead, so that a replacement can start", pid);
    ::kill(pid, SIGKILL);
  };
  if (!metrics_address.empty()) check_listen_address(metrics_address, "--metrics");
  CoordinatorServer coordinator(coordinator_options, job);
  const auto metrics = serve_metrics(metrics_address, coordinator);  // before the run folder: a port in use is bad input
  coordinator.start();
  options.coordinator = "127.0.0.1:" + std::to_string(coordinator.port());
  // `lockstep status RUN_DIR` finds the job from its folder: the address,
  // and the token in a file only this user reads; both go when the job ends.
  const std::string run_folder = (std::filesystem::path(config.job.run_dir) / run_id).string();
  const StatusHandle status_handle(run_folder, options.coordinator, coordinator_options.token);
  JobState& state = coordinator.job_state();
  // A worker that dies costs a restart from the newest complete checkpoint
  // while fault.max_restarts allows: the coordinator decides.
  options.replace = [&state](pid_t pid, const std::string& what, bool bad_input) {
    return state.process_ended(int(pid), what, bad_input);
  };
  options.stop = [&coordinator] { coordinator.stop("lockstep run received SIGUSR1"); };
  const int code = launch_local(options);
  if (const int signal_number = launcher_interrupted_by(); signal_number != 0)
    coordinator.cancel("lockstep run received signal " + std::to_string(signal_number) + " (" +
                       strsignal(signal_number) + (signal_number == SIGINT ? ", Ctrl-C" : "") + ")");
  else if (code != 0)
    coordinator.abort("a worker process failed (see the launcher's message)");
  const int coordinator_code = coordinator.wait(code == 0 ? milliseconds(5000) : milliseconds(0));
  const std::string& folder = run_folder;
  spdlog::info("run folder: {}", folder);
  if (code == 0 && coordinator_code == kExitCompletedWithDrift)  // the last line says so too
    spdlog::error("lockstep run: completed_with_drift: {}; exit {} (see lockstep audit {})",
                  state.drift_summary(), kExitCompletedWithDrift, folder);
  return code != 0 ? code : coordinator_code;
}

namespace {

// Signals become numbers read by a thread of ours. A handler, not a
// blocked mask and sigwait: OpenBLAS starts its threads when the library
// loads, before main, with every signal unblocked, and a signal the kernel
// hands to one of them would take its default action (the end of the
// process) instead of reaching sigwait.
int signal_pipe[2] = {-1, -1};

void on_forwarded_signal(int signal_number) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  [[maybe_unused]] ssize_t written = ::write(signal_pipe[1], &byte, 1);
  errno = saved;
}

void forward_signals(std::initializer_list<int> signal_numbers) {
  if (signal_pipe[0] < 0 && ::pipe2(signal_pipe, O_CLOEXEC) != 0)
    throw RunError(std::string("cannot create the signal pipe: ") + std::strerror(errno));
  struct sigaction action {};
  action.sa_handler = on_forwarded_signal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (int s : signal_numbers) ::sigaction(s, &action, nullptr);
}

// Blocks until a forwarded signal arrives; returns its number (0: the pipe closed).
int next_signal() {
  unsigned char byte = 0;
  for (;;) {
    const ssize_t got = ::read(signal_pipe[0], &byte, 1);
    if (got == 1) return byte;
    if (got < 0 && errno == EINTR) continue;
    return 0;
  }
}

}  // namespace

int coordinator_command(const std::string& job_file, const std::vector<std::string>& overrides,
                        const ServeFlags& serve) {
  // SIGINT/SIGTERM end the job cleanly (workers are told to abort); SIGUSR1
  // stops it after a step every rank agrees on, with a checkpoint there.
  forward_signals({SIGINT, SIGTERM, SIGUSR1});

  std::vector<std::string> passed_on = overrides;
  const ResumePlan resume = plan_resume(serve.resume_dir, passed_on);
  const std::string& resumed_id = resume.run_id;
  JobConfig config = checked_job(job_file, passed_on);
  if (resume_is_already_done(resume, config)) return 0;
  // The data is read on the workers' hosts; when this host has it too, a
  // damaged file is bad input before anything listens.
  check_data_files(config.data, DataHost::workers_hosts);
  if (serve.tls_cert.empty() != serve.tls_key.empty())
    throw InputError("--tls-cert and --tls-key go together: give both, or neither for plaintext");
  CoordinatorOptions options;
  options.listen = serve.listen;
  options.token = resolve_token(serve.token_file);
  options.tls_cert_file = serve.tls_cert;
  options.tls_key_file = serve.tls_key;
  options.run_dir = config.job.run_dir;
  // Bad input before anything listens: the address, and TLS files that are
  // not what they claim to be.
  check_listen_address(serve.listen, "--listen");
  if (!serve.metrics.empty()) check_listen_address(serve.metrics, "--metrics");
  if (!serve.tls_cert.empty()) check_tls_pair(serve.tls_cert, serve.tls_key);

  const std::string& run_id = serve.run_id;
  if (!run_id.empty() && (run_id.find_first_of("/\\") != std::string::npos || run_id == "." ||
                          run_id == ".." || run_id.size() > 200))
    throw InputError("--run-id '" + run_id + "': a folder name is needed (no '/', at most 200 characters)");
  const std::string id = !resumed_id.empty() ? resumed_id : !run_id.empty() ? run_id : new_run_id(config.job.name);
  CoordinatorServer coordinator(options, job_options(config, id));
  const auto metrics = serve_metrics(serve.metrics, coordinator);  // before the run folder: a port in use is bad input
  coordinator.start();
  std::thread([&coordinator] {
    for (int received; (received = next_signal()) > 0;) {
      if (received == SIGUSR1) coordinator.stop("the coordinator received SIGUSR1");
      else coordinator.cancel("the coordinator received signal " + std::to_string(received) +
                              " (" + strsignal(received) + ")");
    }
  }).detach();
  return coordinator.wait();
}

int probe_command(const std::string& candidate, bool force, bool json) {
  if (!candidate.empty()) {
    const auto colon = candidate.find(':', candidate.rfind("cuda:", 0) == 0 ? 5 : 0);
    if (colon == std::string::npos)
      throw InputError("--candidate " + candidate + ": expected DEVICE:DTYPE, e.g. cpu:bf16");
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& r : measure_candidate(candidate.substr(0, colon), candidate.substr(colon + 1), 0.4))
      rows.push_back({{"device", r.device}, {"dtype", r.dtype}, {"op", r.op},
                      {"tflops", r.tflops}, {"error", r.error}});
    std::printf("%s\n", rows.dump().c_str());
    return 0;
  }
  std::string why;
  ProbeTable table = load_or_run_probe(this_executable(), force, &why);
  if (json) {
    nlohmann::json out = table.to_json();
    out["source"] = why;
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("%s", table.text().c_str());
  std::printf("machine: %s, %s cores, bf16 flags: %s; LibTorch %s\n",
              table.fingerprint.value("cpu_model", "?").c_str(),
              table.fingerprint["cores"].dump().c_str(),
              native_bf16_cpu_flags().empty() ? "none" : native_bf16_cpu_flags().c_str(),
              table.fingerprint.value("libtorch", "?").c_str());
  if (!LOCKSTEP_HAS_CUDA)
    std::printf("GPU paths: absent (this lockstep is built against a LibTorch without CUDA: no "
                "CUDA device, no NCCL data group, no fp16)\n");
  else if (!torch::cuda::is_available())
    std::printf("GPU paths: compiled in (LibTorch %s with CUDA and NCCL), but no CUDA device is "
                "visible to this process: CPU rows only\n", LOCKSTEP_TORCH_VERSION);
  std::printf("source: %s\n", why.c_str());
  return 0;
}

int audit_command(const std::string& run_dir, bool json) {
  AuditReport report = audit_run_folder(run_dir);
  if (json) std::printf("%s\n", report.json.dump(2).c_str());
  else std::printf("%s", report.text.c_str());
  return report.exit_code;
}

int compare_command(const std::string& run_a, const std::string& run_b, bool json) {
  const RunComparison comparison = compare_runs(run_a, run_b);
  if (json) std::printf("%s\n", comparison.json.dump(2).c_str());
  else std::printf("%s", comparison.text.c_str());
  return comparison.exit_code;
}

// `lockstep status --json`: field names as in the proto, counts as JSON
// numbers (protobuf's own JSON prints 64-bit integers as strings).
}  // namespace lockstep

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

#include "cli/launcher.h"
#include "cli/resume.h"
#include "lockstep/build_config.h"
#include "coordinator/coordinator.h"
#include "coordinator/endpoint_checks.h"
#include "runtime/checkpoint/checkpoint_store.h"
#include "runtime/audit/audit_report.h"
#include "runtime/data/dataset.h"
#include "runtime/base/errors.h"
#include "runtime/run/generation.h"
#include "runtime/precision/machine.h"
#include "runtime/model/models.h"
#include "runtime/precision/probe.h"
#include "runtime/run/run_folder.h"
#include "worker/coordinator_rendezvous.h"
#include "worker/heartbeat.h"
#include "worker/worker.h"

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

int env_int(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  try {
    size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used != std::strlen(text)) throw std::invalid_argument("trailing characters");
    return value;
  } catch (const std::exception&) {
    throw InputError("environment variable " + std::string(name) + " = '" + text +
                     "' must be an integer");
  }
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
  return job;
}

// The job file with overrides, checked as far as this machine can: keys,
// model name, data files.
JobConfig checked_job(const std::string& job_file, const std::vector<std::string>& overrides) {
  JobConfig config = load_job_config(job_file, overrides);
  // An unknown model, or fault.inject / precision.fp32_modules naming what
  // the model lacks, is bad input before any process starts.
  if (config.model.name == "torchscript" && !std::filesystem::exists(config.model.path))
    spdlog::info("Decision: model_check = on the workers' hosts (model.path {} is not on this host; "
                 "each worker checks its own copy as it loads it, exit 2 if it is not a module)",
                 config.model.path);
  else
    check_injected_faults(config, ModelRegistry::with_builtins());
  check_machine_request(config);                       // device = gpu on a CPU build, ...
  return config;
}

// What a worker takes from its own host's environment.
void read_host_settings(WorkerOptions& options) {
  options.cpu = CpuBudget::of_this_process();
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) options.gloo_socket_ifname = ifname;
}

int torchrun_worker(const std::string& job_file, const std::vector<std::string>& overrides,
                    std::chrono::steady_clock::time_point start) {
  if (job_file.empty())
    throw InputError("lockstep worker needs --coordinator HOST:PORT, or a job file when the "
                     "rank comes from torchrun's variables (RANK, WORLD_SIZE, ...)");
  JobConfig config = load_job_config(job_file, overrides);
  TorchrunRendezvous rendezvous(TorchrunEnv::from_environment());
  WorkerOptions options;
  options.process_start = start;
  options.terminal = ::isatty(STDOUT_FILENO);
  read_host_settings(options);
  run_worker(config, rendezvous, ModelRegistry::with_builtins(), options);
  return 0;
}

}  // namespace

int run_command(const std::string& job_file, const std::vector<std::string>& overrides, int nproc,
                const std::string& resume_dir, const std::string& metrics_address) {
  std::vector<std::string> passed_on = overrides;
  const ResumePlan resume = plan_resume(resume_dir, passed_on);
  const std::string& resumed_id = resume.run_id;
  JobConfig config = checked_job(job_file, passed_on);
  if (nproc > 0 && nproc != config.job.world_size) {
    spdlog::info("Decision: job.world_size = {} (from --nproc; the job file says {})", nproc,
                 config.job.world_size);
    passed_on.push_back("job.world_size=" + std::to_string(nproc));
    config = checked_job(job_file, passed_on);
  }
  validate_data_files(config.data);  // a truncated file is bad input before anything starts
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
  if (config.data.name != "fashion-mnist" || std::filesystem::exists(config.data.path))
    validate_data_files(config.data);
  else
    spdlog::info("Decision: data_check = on the workers' hosts (data.path {} is not on this host; each "
                 "worker checks its own copy as it loads it, exit 2 if damaged)", config.data.path);
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

namespace {

std::atomic<bool> usr1_received{false};  // lock-free: safe to set in a signal handler
static_assert(std::atomic<bool>::is_always_lock_free);

// Join, retried with backoff while the coordinator cannot be reached (it
// may start after its workers, as srun and Kubernetes start processes in
// any order), for at most --rendezvous-timeout. Says once that it waits.
grpc::Status join_when_reachable(CoordinatorClient& client, const ConnectionFlags& connection,
                                 const v1::JoinRequest& request, v1::JoinReply* reply) {
  const auto start = std::chrono::steady_clock::now();
  const auto limit = to_ms(connection.rendezvous_timeout_s);
  auto pause = milliseconds(100);
  for (bool told = false;;) {
    grpc::Status joined = client.join(request, reply, std::chrono::minutes(30));
    if (joined.error_code() != grpc::StatusCode::UNAVAILABLE) return joined;
    const auto waited = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
    if (waited >= limit)
      throw RunError("the coordinator at " + connection.coordinator + " could not be reached for " +
                     fmt::format("{:g}", connection.rendezvous_timeout_s) +
                     " s (--rendezvous-timeout): " + describe(joined) +
                     "; is it running, and is that its address and port?");
    if (!told) {
      spdlog::info("waiting for the coordinator at {} ({}); retrying for up to {:g} s",
                   connection.coordinator, describe(joined), connection.rendezvous_timeout_s);
      told = true;
    }
    std::this_thread::sleep_for(std::min(pause, limit - waited));
    pause = std::min(pause * 2, milliseconds(250));  // with the channel's 500 ms backoff: joined within 1 s
  }
}

// A host that does not share the coordinator's run folder (its marker reads
// differently here, or not at all) sends this rank's files there, so that
// the coordinator's folder holds the whole run: manifest, evidence, events.
// Gives up at the first file the coordinator does not take within `deadline`.
void send_run_files(CoordinatorClient& client, const v1::JoinReply& reply, const JobConfig& config,
                    milliseconds deadline) {
  const RunFolder folder(config.job.run_dir, reply.run_id());
  std::ifstream marker(folder.file(".coordinator"));
  std::string seen((std::istreambuf_iterator<char>(marker)), std::istreambuf_iterator<char>());
  if (seen == reply.folder_marker()) return;  // one folder: nothing to send
  std::vector<std::string> names = {"events-rank" + std::to_string(reply.rank()) + ".jsonl",
                                    "audit-rank" + std::to_string(reply.rank()) + ".jsonl"};
  if (reply.rank() == 0) names.insert(names.end(), {"manifest.json", "model-final.pt"});
  // TensorBoard's files too, so that `tensorboard --logdir` and `lockstep
  // report` on the coordinator's folder see every rank.
  const std::string board = "tensorboard/rank" + std::to_string(reply.rank());
  std::error_code listing;
  for (const auto& entry : std::filesystem::directory_iterator(folder.file(board), listing))
    if (entry.is_regular_file() && entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      names.push_back(board + "/" + entry.path().filename().string());
  std::string sent;
  for (const auto& name : names) {
    if (!std::filesystem::exists(folder.file(name))) continue;
    grpc::Status status = client.put_file(reply.run_id(), reply.rank(), name, folder.file(name), deadline);
    if (!status.ok()) {
      spdlog::warn("could not send {} to the coordinator ({}); it and the rest stay in {}", name,
                   describe(status), folder.path());
      break;
    }
    sent += (sent.empty() ? "" : ", ") + name;
  }
  spdlog::info("Decision: run_files = sent to the coordinator ({}) (this host does not share the "
               "coordinator's run folder: {} has no matching .coordinator marker; the files stay "
               "here too)", sent.empty() ? "none" : sent, folder.path());
}

// One generation of a coordinated worker: joins, trains, reports. Returns
// the generation when the coordinator ended it and the job restarts (the
// caller joins again from this process), 0 when this rank finished (or
// stopped on request: it did what it was asked, so that srun
// --kill-on-bad-exit leaves its peers alone; the job's status, stopped, is
// the coordinator's exit code).
int64_t run_one_generation(CoordinatorClient& client, const ConnectionFlags& connection,
                           int64_t previous_generation, std::chrono::steady_clock::time_point start) {
  v1::JoinRequest request;
  request.set_api_version("lockstep.v1");
  request.set_hostname(host_name());
  request.set_local_rank(env_int("LOCAL_RANK", -1));
  request.set_pid(::getpid());
  request.set_previous_generation(previous_generation);
  if (std::getenv("RANK")) request.set_claimed_rank(env_int("RANK", 0));
  v1::JoinReply reply;
  grpc::Status joined = join_when_reachable(client, connection, request, &reply);
  if (!joined.ok()) {
    auto code = joined.error_code();
    std::string message = "the coordinator at " + connection.coordinator + " did not let this "
                          "worker join: " + describe(joined);
    if (code == grpc::StatusCode::UNAUTHENTICATED || code == grpc::StatusCode::FAILED_PRECONDITION ||
        code == grpc::StatusCode::NOT_FOUND || code == grpc::StatusCode::RESOURCE_EXHAUSTED)
      throw InputError(message);
    throw RunError(message);
  }
  start_new_generation();
  // The generation, as torchrun tells its workers (and for test.fail_generations).
  const std::string restart_count = std::to_string(reply.generation() - 1);
  ::setenv("TORCHELASTIC_RESTART_COUNT", restart_count.c_str(), 1);
  ::setenv("LOCKSTEP_RESTART_COUNT", restart_count.c_str(), 1);
  JobConfig config = config_from_join(reply);
  spdlog::info("joined run {} as rank {} of {} (generation {}{}) through {}", reply.run_id(),
               reply.rank(), reply.world_size(), reply.generation(),
               previous_generation > 0 ? ", the same process as in generation " +
                                             std::to_string(previous_generation)
                                       : "",
               connection.coordinator);

  HeartbeatOptions beat{reply.run_id(), reply.rank(), reply.generation(), to_ms(config.fault.heartbeat_s),
                        to_ms(config.fault.heartbeat_timeout_s), to_ms(config.comm.collective_timeout_s + 10),
                        &usr1_received};
  if (reply.rank() == 0) {  // the manifest's writer: a dead job must not go on saying "running"
    const RunFolder folder(config.job.run_dir, reply.run_id());
    beat.on_coordinator_lost = [folder](const std::string& why) { folder.record_sudden_end(why); };
  }
  HeartbeatLoop heartbeat(client, beat);
  CoordinatorRendezvous rendezvous(reply, client);
  WorkerOptions options;
  options.process_start = start;
  const char* terminal = std::getenv("LOCKSTEP_TERMINAL");
  options.terminal = terminal ? std::string(terminal) == "1" : ::isatty(STDOUT_FILENO);
  options.observer = &heartbeat;
  options.restarted = reply.resume();
  options.generation = reply.generation();
  read_host_settings(options);

  v1::ReportRequest report;
  report.set_run_id(reply.run_id());
  report.set_rank(reply.rank());
  report.set_generation(reply.generation());
  try {
    WorkerSummary summary = run_worker(config, rendezvous, ModelRegistry::with_builtins(), options);
    heartbeat.stop();
    send_run_files(client, reply, config, milliseconds(30000));
    report.set_success(true);
    report.set_stopped_at_step(summary.metrics.value("stopped_at_step", int64_t(0)));
    report.set_metrics_json(summary.metrics.dump());
    report.set_decisions_json(summary.decisions.dump());
  } catch (const GenerationEnded& e) {
    spdlog::warn("rank {}: {}; joining the next generation", reply.rank(), e.what());
    heartbeat.stop();
    return reply.generation();
  } catch (const std::exception& e) {
    const bool peer_may_be_lost = dynamic_cast<const BarrierTimeout*>(&e) ||
                                  !(dynamic_cast<const RunError*>(&e) || dynamic_cast<const InputError*>(&e));
    if (peer_may_be_lost) {
      // A LibTorch or Gloo error, or a barrier a peer never reached: most
      // often a peer that vanished. The coordinator decides: REJOIN (the job
      // restarts) or ABORT (ends this process naming the dead rank).
      spdlog::warn("rank {}: {}; waiting up to {:g} s for the coordinator's verdict on the peers",
                   reply.rank(), e.what(), config.fault.heartbeat_timeout_s + 2);
      if (heartbeat.wait_for_generation_end(to_ms(config.fault.heartbeat_timeout_s + 2))) {
        heartbeat.stop();
        spdlog::warn("rank {}: joining the next generation", reply.rank());
        return reply.generation();
      }
    }
    heartbeat.stop();
    send_run_files(client, reply, config, milliseconds(2000));
    report.set_success(false);
    report.set_peer_may_be_lost(peer_may_be_lost);
    // A model's failure: its line, then the whole message, which the
    // coordinator prints once for the job (bounded, as gRPC fields are).
    if (const auto* model_failure = dynamic_cast<const ModelFailure*>(&e))
      report.set_error(std::string(e.what()) + "\n" + model_failure->detail().substr(0, 16000));
    else
      report.set_error(e.what());
    if (auto sent = client.report(report, milliseconds(10000)); !sent.ok())
      spdlog::warn("could not report the failure to the coordinator: {}", describe(sent));
    throw;
  }
  if (auto sent = client.report(report, milliseconds(10000)); !sent.ok())
    spdlog::warn("could not report to the coordinator: {}", describe(sent));
  return 0;
}

}  // namespace

int worker_command(const std::string& job_file, const std::vector<std::string>& overrides,
                   const ConnectionFlags& connection, std::chrono::steady_clock::time_point start) {
  if (connection.coordinator.empty()) return torchrun_worker(job_file, overrides, start);
  if (!job_file.empty() || !overrides.empty())
    throw InputError("with --coordinator the job comes from the coordinator: drop the job file "
                     "and --set");
  // The host's settings are bad input before anything is dialled.
  for (const char* name : {"RANK", "LOCAL_RANK"})
    if (env_int(name, 0) < 0)
      throw InputError("environment variable " + std::string(name) + " = '" + std::getenv(name) +
                       "' must be 0 or more");
  check_connection(connection);
  CoordinatorClient client({connection.coordinator, resolve_token(connection.token_file),
                            connection.tls_ca});
  // SIGUSR1 (Slurm's --signal=USR1@T, sent to the tasks): every rank stops
  // after a step they agree on, with a checkpoint there.
  struct sigaction action {};
  action.sa_handler = [](int) { usr1_received = true; };
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGUSR1, &action, nullptr);
  // Generation after generation while the coordinator restarts the job.
  for (int64_t previous = 0;;) {
    previous = run_one_generation(client, connection, previous, start);
    if (previous == 0) return 0;
    start = std::chrono::steady_clock::now();
  }
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
  std::printf("source: %s\n", why.c_str());
  return 0;
}

int audit_command(const std::string& run_dir, bool json) {
  AuditReport report = audit_run_folder(run_dir);
  if (json) std::printf("%s\n", report.json.dump(2).c_str());
  else std::printf("%s", report.text.c_str());
  return report.exit_code;
}

// `lockstep status --json`: field names as in the proto, counts as JSON
// numbers (protobuf's own JSON prints 64-bit integers as strings).
}  // namespace lockstep

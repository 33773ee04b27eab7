// `lockstep worker`: one rank, joining a coordinator generation after
// generation (or, with a job file, under torchrun's variables), with its
// heartbeat and its files sent where the coordinator's folder is not shared.
#include "cli/commands.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "runtime/audit/cross_check.h"
#include "runtime/base/errors.h"
#include "runtime/run/generation.h"
#include "runtime/run/run_folder.h"
#include "worker/coordinator_client.h"
#include "worker/coordinator_rendezvous.h"
#include "worker/heartbeat.h"
#include "runtime/startup/job_checks.h"
#include "worker/worker.h"

namespace lockstep {
namespace {

using std::chrono::milliseconds;

// Seconds from the job file as a timeout (named apart from commands.cpp's
// to_ms: a unity build compiles both files as one).
milliseconds ms_of(double seconds) { return milliseconds(int64_t(seconds * 1000.0)); }

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

void read_host_settings(WorkerOptions& options) {
  options.cpu = CpuBudget::of_this_process();
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) options.gloo_socket_ifname = ifname;
}

int torchrun_worker(const std::string& job_file, const std::vector<std::string>& overrides,
                    std::chrono::steady_clock::time_point start) {
  if (job_file.empty())
    throw InputError("lockstep worker needs --coordinator HOST:PORT, or a job file when the "
                     "rank comes from torchrun's variables (RANK, WORLD_SIZE, ...)");
  JobConfig config = checked_job(job_file, overrides);
  check_devices_here(config);
  TorchrunRendezvous rendezvous(TorchrunEnv::from_environment());
  WorkerOptions options;
  options.process_start = start;
  options.terminal = ::isatty(STDOUT_FILENO);
  read_host_settings(options);
  run_worker(config, rendezvous, ModelRegistry::with_builtins(), options);
  return 0;
}



std::atomic<bool> usr1_received{false};  // lock-free: safe to set in a signal handler
static_assert(std::atomic<bool>::is_always_lock_free);

// Join, retried with backoff while the coordinator cannot be reached (it
// may start after its workers, as srun and Kubernetes start processes in
// any order), for at most --rendezvous-timeout. Says once that it waits.
grpc::Status join_when_reachable(CoordinatorClient& client, const ConnectionFlags& connection,
                                 const v1::JoinRequest& request, v1::JoinReply* reply) {
  const auto start = std::chrono::steady_clock::now();
  const auto limit = ms_of(connection.rendezvous_timeout_s);
  auto pause = milliseconds(100);
  std::string standing_by;
  for (bool told = false;;) {
    grpc::Status joined = client.join(request, reply, std::chrono::minutes(30));
    if (joined.error_code() != grpc::StatusCode::UNAVAILABLE) return joined;
    // An elastic job that runs on as many ranks as its microbatches allow
    // keeps this worker as a standby: it asks again every second, for as
    // long as the job runs, and is taken when it can grow.
    if (joined.error_message().rfind("standby:", 0) == 0) {
      if (joined.error_message() != standing_by)
        spdlog::info("{}", standing_by = joined.error_message());
      std::this_thread::sleep_for(milliseconds(1000));
      continue;
    }
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
// The step evidence this process wrote, one file per generation it was a
// rank in (rank, file name): sent with the files of its last.
std::vector<std::pair<int, std::string>>& evidence_written() {
  static std::vector<std::pair<int, std::string>> files;
  return files;
}

void send_run_files(CoordinatorClient& client, const v1::JoinReply& reply, const JobConfig& config,
                    milliseconds deadline) {
  const RunFolder folder(config.job.run_dir, reply.run_id());
  std::ifstream marker(folder.file(".coordinator"));
  std::string seen((std::istreambuf_iterator<char>(marker)), std::istreambuf_iterator<char>());
  if (seen == reply.folder_marker()) return;  // one folder: nothing to send
  std::vector<std::pair<int, std::string>> names = {{reply.rank(), "events-rank" + std::to_string(reply.rank()) + ".jsonl"},
                                                    {reply.rank(), "audit-rank" + std::to_string(reply.rank()) + ".jsonl"}};
  names.insert(names.end(), evidence_written().begin(), evidence_written().end());
  if (reply.rank() == 0) names.insert(names.end(), {{0, "manifest.json"}, {0, "model-final.pt"}});
  // TensorBoard's files too, so that `tensorboard --logdir` and `lockstep
  // report` on the coordinator's folder see every rank.
  const std::string board = "tensorboard/rank" + std::to_string(reply.rank());
  std::error_code listing;
  for (const auto& entry : std::filesystem::directory_iterator(folder.file(board), listing))
    if (entry.is_regular_file() && entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      names.push_back({reply.rank(), board + "/" + entry.path().filename().string()});
  std::string sent;
  for (const auto& [rank, name] : names) {
    if (!std::filesystem::exists(folder.file(name))) continue;
    grpc::Status status = client.put_file(reply.run_id(), rank, name, folder.file(name), deadline);
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
                           int64_t previous_generation, std::chrono::steady_clock::time_point start,
                           std::optional<StateInMemory>& kept_state) {
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
  evidence_written().push_back({reply.rank(), step_evidence_file(reply.generation(), reply.rank())});
  // The generation, as torchrun tells its workers (and for test.fail_generations).
  const std::string restart_count = std::to_string(reply.generation() - 1);
  ::setenv("TORCHELASTIC_RESTART_COUNT", restart_count.c_str(), 1);
  ::setenv("LOCKSTEP_RESTART_COUNT", restart_count.c_str(), 1);
  JobConfig config = config_from_join(reply);
  const bool elastic = config.elastic.min_ranks > 0 && config.elastic.min_ranks < config.job.world_size;
  if (reply.world_size() != config.job.world_size) {
    // An elastic job on fewer ranks than its maximum: the same global batch
    // and microbatches, each rank computing more of them.
    const int64_t k = microbatches_per_step(config);
    if (!elastic || reply.world_size() < 1 || k % reply.world_size() != 0)
      throw RunError("the coordinator placed this worker in a world of " + std::to_string(reply.world_size()) +
                     " ranks, which job.world_size = " + std::to_string(config.job.world_size) + " and " +
                     std::to_string(k) + " microbatches a step do not allow");
    config.decisions.push_back({"world_size", std::to_string(reply.world_size()),
                                "elastic: generation " + std::to_string(reply.generation()) + " runs on " +
                                    std::to_string(reply.world_size()) + " of at most " +
                                    std::to_string(config.job.world_size) + " ranks; the " + std::to_string(k) +
                                    " microbatches of a step are divided among them"});
    config.job.world_size = reply.world_size();
    config.train.accum_steps = k / reply.world_size();
  }
  spdlog::info("joined run {} as rank {} of {} (generation {}{}) through {}", reply.run_id(),
               reply.rank(), reply.world_size(), reply.generation(),
               previous_generation > 0 ? ", the same process as in generation " +
                                             std::to_string(previous_generation)
                                       : "",
               connection.coordinator);

  HeartbeatOptions beat{reply.run_id(), reply.rank(), reply.generation(), ms_of(config.fault.heartbeat_s),
                        ms_of(config.fault.heartbeat_timeout_s), ms_of(config.comm.collective_timeout_s + 10),
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
  options.elastic = elastic;
  options.kept_state = &kept_state;
  read_host_settings(options);

  v1::ReportRequest report;
  report.set_run_id(reply.run_id());
  report.set_rank(reply.rank());
  report.set_generation(reply.generation());
  try {
    WorkerSummary summary = run_worker(config, rendezvous, ModelRegistry::with_builtins(), options);
    heartbeat.stop();
    if (summary.metrics.value("regroup", false)) {
      spdlog::info("rank {}: stopped after step {} for the regroup; joining the next generation with the "
                   "state in memory", reply.rank(), summary.metrics.value("stopped_at_step", int64_t(0)));
      return reply.generation();
    }
    send_run_files(client, reply, config, milliseconds(30000));
    report.set_success(true);
    report.set_stopped_at_step(summary.metrics.value("stopped_at_step", int64_t(0)));
    report.set_metrics_json(summary.metrics.dump());
    report.set_decisions_json(summary.decisions.dump());
  } catch (const GenerationEnded& e) {
    spdlog::warn("rank {}: {}; joining the next generation", reply.rank(), e.what());
    heartbeat.stop();
    return reply.generation();
  } catch (const MiscomputeExcluded& e) {
    // Every rank found it: each asks the coordinator to exclude the host
    // (the first ask counts), then rejoins with the state before the step.
    // A worker on that host is refused when it rejoins: its files go to
    // the coordinator first, the evidence of the steps it did compute.
    send_run_files(client, reply, config, milliseconds(5000));
    report.set_success(false);
    report.set_error(e.what());
    report.set_exclude_host(e.host);
    if (auto sent = client.report(report, milliseconds(10000)); !sent.ok())
      spdlog::warn("could not ask the coordinator to exclude {}: {}", e.host, describe(sent));
    if (heartbeat.wait_for_generation_end(ms_of(config.fault.heartbeat_timeout_s + 2))) {
      heartbeat.stop();
      spdlog::warn("rank {}: host {} is excluded; joining the next generation", reply.rank(), e.host);
      return reply.generation();
    }
    heartbeat.stop();
    throw;
  } catch (const std::exception& e) {
    const bool peer_may_be_lost = dynamic_cast<const CollectiveFailed*>(&e) ||  // a barrier timeout too
                                  !(dynamic_cast<const RunError*>(&e) || dynamic_cast<const InputError*>(&e));
    if (peer_may_be_lost) {
      // A LibTorch or Gloo error, raw or named by its caller (CollectiveFailed,
      // a barrier a peer never reached among them): most often a peer that vanished.
      // The coordinator decides: REJOIN (the job restarts) or ABORT (ends
      // this process naming the dead rank).
      spdlog::warn("rank {}: {}; waiting up to {:g} s for the coordinator's verdict on the peers",
                   reply.rank(), e.what(), config.fault.heartbeat_timeout_s + 2);
      if (heartbeat.wait_for_generation_end(ms_of(config.fault.heartbeat_timeout_s + 2))) {
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
  // A peer that shut its connections down (it left a generation this
  // process was frozen through) must make a send fail with an error the
  // rank reports, not end the process with SIGPIPE before it says why.
  ::signal(SIGPIPE, SIG_IGN);
  // Generation after generation while the coordinator restarts the job; an
  // elastic job's state stays in this process from one to the next.
  std::optional<StateInMemory> kept_state;
  for (int64_t previous = 0;;) {
    previous = run_one_generation(client, connection, previous, start, kept_state);
    if (previous == 0) return 0;
    start = std::chrono::steady_clock::now();
  }
}

}  // namespace lockstep

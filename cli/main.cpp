// lockstep: the command front. Parses the command line and hands over to a
// subcommand. Exit codes: 0 success, 1 failed run, 2 bad input.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "lockstep/build_config.h"
#include "runtime/base/errors.h"

int main(int argc, char** argv) {
  using namespace lockstep;
  const auto start = std::chrono::steady_clock::now();
  spdlog::set_pattern("%H:%M:%S.%e %^%l%$ %v");

  CLI::App app{"lockstep " LOCKSTEP_VERSION ": data-parallel training that never fails silently"};
  app.require_subcommand(1);
  // What this binary can drive: the LibTorch it links, and whether CUDA and
  // the NCCL data group are compiled in (a GPU at run time is another matter).
#ifdef USE_C10D_NCCL
  const char* nccl = "NCCL data group compiled in";
#else
  const char* nccl = "no NCCL";
#endif
  app.set_version_flag("--version", std::string("lockstep " LOCKSTEP_VERSION " (LibTorch " LOCKSTEP_TORCH_VERSION ", ") +
                                        (LOCKSTEP_HAS_CUDA ? "CUDA" : "CPU only, no CUDA") + ", " + nccl + ")");
  std::string job_file, resume_dir;
  ServeFlags serve;
  std::vector<std::string> overrides;
  ConnectionFlags connection;
  int nproc = 0;
  bool json = false, quiet = false;
  const char* quiet_help = "print warnings and errors only (decisions still go to manifest.json and the events)";
  auto add_connection = [&](CLI::App* command, bool required) {
    auto* option = command->add_option("--coordinator", connection.coordinator,
                                       "the coordinator's HOST:PORT");
    if (required) option->required();
    command->add_option("--token-file", connection.token_file,
                        "file holding the job token (else LOCKSTEP_TOKEN)");
    command->add_option("--tls-ca", connection.tls_ca,
                        "PEM file of the CA that signed the coordinator's certificate (TLS)");
  };

  auto* run = app.add_subcommand("run", "train on this machine: an embedded coordinator and N "
                                        "local workers");
  run->add_option("job", job_file, "job file (TOML)")->required();
  run->add_option("--nproc", nproc, "workers to start (default: job.world_size)")
      ->check(CLI::Range(1, 4096));
  run->add_option("--set", overrides, "override a job key: --set optim.lr=0.1");
  run->add_option("--resume", resume_dir,
                  "continue the run in RUN_DIR from its newest valid checkpoint");
  run->add_option("--metrics", serve.metrics, "HOST:PORT: serve Prometheus metrics at /metrics while the job runs");
  run->add_flag("--quiet,-q", quiet, quiet_help);

  auto* coordinator = app.add_subcommand("coordinator", "serve one job to workers that join");
  coordinator->add_option("job", job_file, "job file (TOML)")->required();
  coordinator->add_option("--listen", serve.listen, "HOST:PORT to listen on (port 0: any free port)");
  coordinator->add_option("--set", overrides, "override a job key: --set optim.lr=0.1");
  coordinator->add_option("--token-file", serve.token_file,
                          "file holding the job token (else LOCKSTEP_TOKEN)");
  coordinator->add_option("--tls-cert", serve.tls_cert, "PEM certificate: serve TLS");
  coordinator->add_option("--metrics", serve.metrics,
                          "HOST:PORT: serve Prometheus metrics at /metrics (port 0: any free port)");
  coordinator->add_option("--tls-key", serve.tls_key, "PEM private key of --tls-cert");
  coordinator->add_flag("--quiet,-q", quiet, quiet_help);
  coordinator->add_option("--resume", serve.resume_dir,
                          "continue the run in RUN_DIR from its newest valid checkpoint");
  coordinator->add_option("--run-id", serve.run_id,
                          "the run's id (its folder's name) instead of a new one, e.g. "
                          "slurm-$SLURM_JOB_ID so that a requeued job finds its folder")
      ->excludes("--resume");

  auto* worker = app.add_subcommand(
      "worker", "run one rank: join --coordinator, or rendezvous from torchrun's variables "
                "(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) with a job file");
  worker->add_option("job", job_file, "job file (TOML), without --coordinator");
  worker->add_option("--set", overrides, "override a job key (without --coordinator)");
  add_connection(worker, false);
  worker->add_flag("--quiet,-q", quiet, quiet_help);
  worker->add_option("--rendezvous-timeout", connection.rendezvous_timeout_s,
                     "seconds to keep trying a coordinator that is not reachable yet (default 120, "
                     "like comm.rendezvous_timeout_s)")
      ->check(CLI::Range(0.001, 86400.0));

  std::string run_dir;
  auto* status = app.add_subcommand("status", "show a running job, one row per rank");
  status->add_option("run_dir", run_dir, "the run folder of a `lockstep run` job (instead of --coordinator)");
  add_connection(status, false);
  status->add_flag("--json", json, "print JSON for scripts");
  bool watch = false;
  status->add_flag("--watch", watch, "print again every second until the job ends");

  auto* audit = app.add_subcommand("audit", "offline: did the ranks of a run agree at every audit?");
  audit->add_option("run_dir", run_dir, "the run folder, runs/<run-id>")->required();
  audit->add_flag("--json", json, "print JSON for scripts");

  std::vector<std::string> compared;
  auto* compare = app.add_subcommand("compare", "offline: did two runs end on the same bits? If not, the first "
                                                "audited step where they parted and the largest difference there");
  compare->add_option("runs", compared, "two run folders, runs/<run-id>")->required()->expected(2);
  compare->add_flag("--json", json, "print JSON for scripts");

  std::string verify_steps;
  auto* verify = app.add_subcommand("verify", "offline: replay a run's steps on this machine (one rank, from "
                                              "the nearest checkpoint) and check every microbatch's gradient and "
                                              "every step's state against the run's evidence");
  verify->add_option("run_dir", run_dir, "the run folder, runs/<run-id>")->required();
  verify->add_option("--steps", verify_steps, "A:B, the steps to check (default: every recorded step)");
  verify->add_flag("--json", json, "print JSON for scripts");

  std::string candidate;
  bool force = false;
  auto* probe = app.add_subcommand("probe", "measure fp32, bf16 and fp16 on this machine's "
                                            "devices; precision = auto reads the result");
  probe->add_flag("--force", force, "measure again even when the cache matches this machine");
  probe->add_flag("--json", json, "print JSON for scripts");
  probe->add_option("--candidate", candidate, "internal: measure DEVICE:DTYPE in this process")
      ->group("");

  auto* config = app.add_subcommand("config", "print the effective configuration of a job file with "
                                              "--set overrides, each key's source in a comment");
  config->add_option("job", job_file, "job file (TOML)")->required();
  config->add_option("--set", overrides, "override a job key: --set optim.lr=0.1");
  config->add_flag("--json", json, "print JSON for scripts: the configuration and each key's source");

  auto* keys = app.add_subcommand("keys", "list every job key with its type, default and allowed values");
  keys->add_flag("--json", json, "print JSON for scripts");

  std::vector<std::string> report_dirs;
  std::string report_output;
  bool csv = false;
  auto* report = app.add_subcommand("report", "an HTML page of one run or several overlaid (curves, phases, "
                                              "audit timeline, restarts, decisions, settings), or --csv");
  report->add_option("run_dirs", report_dirs, "run folders, runs/<run-id> (at most 4)")->required();
  report->add_option("-o,--output", report_output,
                     "file to write (default RUN_DIR/report.html for one run, ./report.html for several; "
                     "- for stdout)");
  report->add_flag("--csv", csv, "write the per-step figures of every rank as CSV instead");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }

  if (quiet) spdlog::set_level(spdlog::level::warn);
  try {
    if (run->parsed()) return run_command(job_file, overrides, nproc, resume_dir, serve.metrics);
    if (coordinator->parsed())
      return coordinator_command(job_file, overrides, serve);
    if (status->parsed()) return status_command(connection, run_dir, json, watch);
    if (audit->parsed()) return audit_command(run_dir, json);
    if (compare->parsed()) return compare_command(compared[0], compared[1], json);
    if (verify->parsed()) return verify_command(run_dir, verify_steps, json);
    if (probe->parsed()) return probe_command(candidate, force, json);
    if (config->parsed()) return config_command(job_file, overrides, json);
    if (keys->parsed()) return keys_command(json);
    if (report->parsed()) return report_command(report_dirs, report_output, csv);
    return worker_command(job_file, overrides, connection, start);
  } catch (const InputError& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}

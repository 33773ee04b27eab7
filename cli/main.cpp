// lockstep: the command front. Parses the command line, then hands over to
// the launcher or the worker. Exit codes: 0 success, 1 failed run, 2 bad input.
#include <unistd.h>

#include <filesystem>
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "cli/launcher.h"
#include "lockstep/build_config.h"
#include "runtime/dataset.h"
#include "runtime/errors.h"
#include "runtime/models.h"
#include "runtime/run_folder.h"
#include "worker/worker.h"

namespace {

using namespace lockstep;

int run_command(const std::string& job_file, const std::vector<std::string>& overrides, int nproc) {
  JobConfig config = load_job_config(job_file, overrides);
  std::vector<std::string> passed_on = overrides;
  if (nproc > 0 && nproc != config.job.world_size) {
    spdlog::info("Decision: job.world_size = {} (from --nproc; the job file says {})", nproc,
                 config.job.world_size);
    passed_on.push_back("job.world_size=" + std::to_string(nproc));
    config = load_job_config(job_file, passed_on);
  }
  ModelRegistry::with_builtins().build(config.model);  // an unknown model is bad input: exit 2
  check_data_files(config.data);

  LaunchOptions options;
  options.executable = std::filesystem::read_symlink("/proc/self/exe").string();
  options.job_file = job_file;
  options.overrides = overrides;
  options.nproc = int(config.job.world_size);
  options.run_id = new_run_id(config.job.name);
  options.terminal = ::isatty(STDOUT_FILENO);
  options.store_timeout_s = config.comm.rendezvous_timeout_s;
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  options.threads_per_rank = std::max(1, int(cores) / options.nproc);
  spdlog::info("Decision: OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = {} ({} cores / {} local ranks; "
               "unless already set)", options.threads_per_rank, cores, options.nproc);
  int code = launch_local(options);
  spdlog::info("run folder: {}/{}", config.job.run_dir, options.run_id);
  return code;
}

int worker_command(const std::string& job_file, const std::vector<std::string>& overrides,
                   std::chrono::steady_clock::time_point start) {
  JobConfig config = load_job_config(job_file, overrides);
  TorchrunRendezvous rendezvous(TorchrunEnv::from_environment());
  WorkerOptions options;
  options.process_start = start;
  const char* terminal = std::getenv("LOCKSTEP_TERMINAL");
  options.terminal = terminal ? std::string(terminal) == "1" : ::isatty(STDOUT_FILENO);
  run_worker(config, rendezvous, ModelRegistry::with_builtins(), options);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();
  spdlog::set_pattern("%H:%M:%S.%e %^%l%$ %v");

  CLI::App app{"lockstep " LOCKSTEP_VERSION ": data-parallel training that never fails silently"};
  app.require_subcommand(1);
  std::string job_file;
  std::vector<std::string> overrides;
  int nproc = 0;

  auto* run = app.add_subcommand("run", "train on this machine: start N local ranks");
  run->add_option("job", job_file, "job file (TOML)")->required();
  run->add_option("--nproc", nproc, "ranks to start (default: job.world_size)")
      ->check(CLI::Range(1, 4096));
  run->add_option("--set", overrides, "override a job key: --set optim.lr=0.1");

  auto* worker = app.add_subcommand("worker", "run one rank; rendezvous from torchrun's variables "
                                              "(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...)");
  worker->add_option("job", job_file, "job file (TOML)")->required();
  worker->add_option("--set", overrides, "override a job key: --set optim.lr=0.1");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }

  try {
    if (run->parsed()) return run_command(job_file, overrides, nproc);
    return worker_command(job_file, overrides, start);
  } catch (const InputError& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}

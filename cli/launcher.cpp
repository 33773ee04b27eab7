#include "cli/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>

#include <spdlog/spdlog.h>

#include "runtime/base/errors.h"

extern char** environ;

namespace lockstep {
namespace {

volatile sig_atomic_t g_interrupted = 0;  // the SIGINT/SIGTERM the launcher received
void on_signal(int signal_number) { g_interrupted = signal_number; }
volatile sig_atomic_t g_stop_asked = 0;  // SIGUSR1: stop at a checkpoint
void on_stop_signal(int) { g_stop_asked = 1; }

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int output = -1;      // read end of the merged stdout/stderr pipe
  std::string pending;  // output not yet ended by a newline
  bool running = true;
  int status = 0;
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "ended with wait status " + std::to_string(status);
}

// Writes complete lines (and in-place progress segments ending in '\r')
// with the rank prefix.
void relay(Child& child, bool flush_all) {
  std::string& buffer = child.pending;
  size_t start = 0;
  for (size_t i = 0; i < buffer.size(); ++i) {
    if (buffer[i] != '\n' && buffer[i] != '\r') continue;
    std::string line = buffer.substr(start, i - start);
    if (buffer[i] == '\r') {
      if (!line.empty()) std::printf("\r[rank %d] %s", child.rank, line.c_str());
    } else {
      std::printf("[rank %d] %s\n", child.rank, line.c_str());
    }
    start = i + 1;
  }
  buffer.erase(0, start);
  if (flush_all && !buffer.empty()) {
    std::printf("[rank %d] %s\n", child.rank, buffer.c_str());
    buffer.clear();
  }
  std::fflush(stdout);
}

std::vector<std::string> child_environment(const LaunchOptions& options, int rank) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string item(*e);
    auto eq = item.find('=');
    if (eq != std::string::npos) env[item.substr(0, eq)] = item.substr(eq + 1);
  }
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) env.erase(name);
  env["LOCAL_RANK"] = std::to_string(rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(options.nproc);
  env["LOCKSTEP_TOKEN"] = options.token;
  // TORCHELASTIC_RESTART_COUNT and LOCKSTEP_RESTART_COUNT: set by the worker
  // from the generation it joins.
  for (const char* name : {"TORCHELASTIC_RESTART_COUNT", "LOCKSTEP_RESTART_COUNT"}) env.erase(name);
  env["LOCKSTEP_TERMINAL"] = options.terminal ? "1" : "0";
  // Threads: each worker derives its own (job.threads_per_rank, affinity,
  // cgroup quota, a user's OMP_NUM_THREADS), so nothing is set here.
  std::vector<std::string> out;
  for (const auto& [key, value] : env) out.push_back(key + "=" + value);
  return out;
}

std::vector<char*> pointers(std::vector<std::string>& items) {
  std::vector<char*> out;
  for (auto& s : items) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

Child spawn_worker(const LaunchOptions& options, int rank) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
    throw RunError(std::string("cannot create a pipe for rank ") + std::to_string(rank) + ": " +
                   std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);

  std::vector<std::string> args = {options.executable, "worker", "--coordinator",
                                   options.coordinator};
  if (options.quiet) args.push_back("--quiet");
  std::vector<std::string> env = child_environment(options, rank);
  auto argv = pointers(args);
  auto envp = pointers(env);

  Child child;
  child.rank = rank;
  int error = posix_spawn(&child.pid, options.executable.c_str(), &actions, nullptr, argv.data(),
                          envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (error != 0) {
    ::close(pipe_fds[0]);
    throw RunError("cannot start rank " + std::to_string(rank) + " (" + options.executable +
                   "): " + std::strerror(error));
  }
  child.output = pipe_fds[0];
  return child;
}

void signal_running(std::vector<Child>& children, int signal_number) {
  for (auto& c : children)
    if (c.running) ::kill(c.pid, signal_number);
}

}  // namespace

int launch_local(const LaunchOptions& options) {
  using Clock = std::chrono::steady_clock;
  spdlog::info("launcher: starting {} workers for the coordinator at {}", options.nproc,
               options.coordinator);

  struct sigaction action {};
  action.sa_handler = on_signal;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  // SIGUSR1 (Slurm's --signal, or by hand) asks for a stop at a checkpoint,
  // as it does for `lockstep coordinator`; its default action would kill the
  // launcher and the embedded coordinator with it.
  struct sigaction stop_action {};
  stop_action.sa_handler = on_stop_signal;
  ::sigaction(SIGUSR1, &stop_action, nullptr);
  bool stop_passed_on = false;

  std::vector<Child> children;
  try {
    for (int rank = 0; rank < options.nproc; ++rank)
      children.push_back(spawn_worker(options, rank));
  } catch (...) {
    signal_running(children, SIGKILL);
    for (auto& c : children) ::waitpid(c.pid, nullptr, 0);
    throw;
  }

  int first_failed = -1;  // index into children
  std::string failure;
  Clock::time_point stop_started{};
  bool stopping = false, killed = false;
  size_t running = children.size();
  while (running > 0) {
    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    for (auto& c : children)
      if (c.output >= 0) {
        fds.push_back({c.output, POLLIN, 0});
        owners.push_back(&c);
      }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
    else ::usleep(100 * 1000);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[65536];
      ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        owners[i]->pending.append(buffer, size_t(n));
        relay(*owners[i], false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        relay(*owners[i], true);
        ::close(owners[i]->output);
        owners[i]->output = -1;
      }
    }
    for (size_t i = 0; i < children.size(); ++i) {
      Child& c = children[i];
      if (!c.running) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      c.status = status;
      --running;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (ok || first_failed >= 0 || stopping || g_interrupted) continue;
      const bool bad_input = WIFEXITED(status) && WEXITSTATUS(status) == 2;
      if (options.replace && options.replace(c.pid, describe_status(status), bad_input)) {
        const int local_rank = c.rank;
        const pid_t old_pid = c.pid;
        children.push_back(spawn_worker(options, local_rank));  // `c` may move
        ++running;
        spdlog::warn("launcher: local rank {} (pid {}) {}; the job restarts: replacement pid {}",
                     local_rank, old_pid, describe_status(status), children.back().pid);
        continue;
      }
      first_failed = int(i);
      failure = "rank " + std::to_string(c.rank) + " " + describe_status(status);
      spdlog::error("launcher: {}; stopping the other ranks", failure);
    }
    if (g_stop_asked && !stop_passed_on) {
      stop_passed_on = true;
      if (options.stop) {
        options.stop();
      } else {
        spdlog::warn("launcher: SIGUSR1; passing it on to every rank");
        signal_running(children, SIGUSR1);
      }
    }
    if (g_interrupted && !stopping) {
      failure = std::string("interrupted by signal ") + std::to_string(g_interrupted) + " (" +
                strsignal(g_interrupted) + ")";
      spdlog::warn("launcher: interrupted; stopping every rank");
    }
    if ((first_failed >= 0 || g_interrupted) && !stopping && running > 0) {
      stopping = true;
      stop_started = Clock::now();
      signal_running(children, SIGTERM);
    }
    if (stopping && !killed && running > 0 &&
        Clock::now() - stop_started > std::chrono::duration<double>(options.stop_grace_s)) {
      killed = true;
      spdlog::warn("launcher: ranks still running {} s after SIGTERM; sending SIGKILL",
                   options.stop_grace_s);
      signal_running(children, SIGKILL);
    }
  }
  for (auto& c : children)
    if (c.output >= 0) {
      relay(c, true);
      ::close(c.output);
    }

  if (first_failed >= 0) {
    const Child& c = children[size_t(first_failed)];
    spdlog::error("lockstep run failed: {}", failure);
    return WIFEXITED(c.status) && WEXITSTATUS(c.status) == 2 ? 2 : 1;
  }
  if (g_interrupted) {
    spdlog::error("lockstep run failed: {}", failure);
    return 1;
  }
  spdlog::info("launcher: all {} ranks finished", options.nproc);
  return 0;
}

int launcher_interrupted_by() { return g_interrupted; }

}  // namespace lockstep

#include "support/cli_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

extern char** environ;

namespace lockstep::testing {

CommandResult run_lockstep(const std::vector<std::string>& args, const std::string& cwd,
                           double timeout_s) {
  using Clock = std::chrono::steady_clock;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);  // its own group: killed as a whole

  // The child changes into cwd through a shell-free trick: spawn `env -C`.
  std::vector<std::string> argv_strings = {"/usr/bin/env", "-C", cwd, LOCKSTEP_EXE};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  const auto start = Clock::now();
  pid_t pid = -1;
  int error = posix_spawn(&pid, argv[0], &actions, &attributes, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(fds[1]);
  if (error != 0) {
    ::close(fds[0]);
    throw std::runtime_error("cannot start lockstep");
  }

  CommandResult result;
  bool open = true, killed = false;
  int status = 0;
  while (true) {
    if (open) {
      pollfd p{fds[0], POLLIN, 0};
      ::poll(&p, 1, 50);
      if (p.revents) {
        char buffer[65536];
        ssize_t n = ::read(fds[0], buffer, sizeof buffer);
        if (n > 0) result.output.append(buffer, size_t(n));
        else open = false;
      }
    } else {
      ::usleep(20000);
    }
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
    if (!killed && Clock::now() - start > std::chrono::duration<double>(timeout_s)) {
      ::kill(-pid, SIGKILL);
      killed = true;
    }
  }
  ::kill(-pid, SIGKILL);  // anything the run left behind in its group
  while (open) {
    char buffer[65536];
    ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n > 0) result.output.append(buffer, size_t(n));
    else open = false;
  }
  ::close(fds[0]);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.exit_code = killed ? -1 : (WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  return result;
}

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "lockstep-test-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string examples_dir() { return std::string(LOCKSTEP_SOURCE_DIR) + "/examples"; }

std::string single_run(const std::string& runs_dir) {
  std::vector<std::string> runs;
  if (std::filesystem::exists(runs_dir))
    for (const auto& entry : std::filesystem::directory_iterator(runs_dir))
      runs.push_back(entry.path().string());
  EXPECT_EQ(runs.size(), 1u) << "expected exactly one run folder in " << runs_dir;
  return runs.empty() ? "" : runs.front();
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  return nlohmann::json::parse(in);
}

std::vector<nlohmann::json> read_json_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace lockstep::testing

#include "support/cli_runner.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

extern char** environ;

namespace lockstep::testing {

LockstepProcess::LockstepProcess(const std::vector<std::string>& args, const std::string& cwd,
                                 const std::vector<std::string>& env,
                                 const std::vector<std::string>& prefix) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);  // its own group: killed as a whole

  // `env -C DIR` starts the binary in DIR without a shell.
  std::vector<std::string> argv_strings = prefix;
  argv_strings.insert(argv_strings.end(), {"/usr/bin/env", "-C", cwd});
  argv_strings.insert(argv_strings.end(), env.begin(), env.end());
  argv_strings.push_back(LOCKSTEP_EXE);
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  int error = posix_spawnp(&pid_, argv[0], &actions, &attributes, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(fds[1]);
  if (error != 0) {
    ::close(fds[0]);
    throw std::runtime_error("cannot start lockstep");
  }
  output_fd_ = fds[0];
  // Read all the time, not only when the test looks: a child whose pipe
  // fills (64 KiB) blocks in its next write, and a rank blocked there leaves
  // its peers waiting in a collective.
  reader_ = std::thread([this] {
    char buffer[65536];
    while (!stop_reading_) {
      pollfd p{output_fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::read(output_fd_, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      std::lock_guard<std::mutex> lock(mutex_);
      output_.append(buffer, size_t(n));
    }
    ended_ = true;
  });
}

LockstepProcess::~LockstepProcess() {
  kill_group();
  wait(10);
  stop_reading_ = true;
  if (reader_.joinable()) reader_.join();
  if (output_fd_ >= 0) ::close(output_fd_);
}

void LockstepProcess::drain(int timeout_ms) {
  if (!ended_) std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
}

std::string LockstepProcess::output() {
  std::lock_guard<std::mutex> lock(mutex_);
  return output_;
}

bool LockstepProcess::wait_for_output(const std::string& text, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (output().find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    drain(50);
  }
  return true;
}

bool LockstepProcess::running() {
  if (exited_) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    exited_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return !exited_;
}

int LockstepProcess::wait(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (running()) {
    if (std::chrono::steady_clock::now() > deadline) return -1;
    drain(20);
  }
  for (int i = 0; i < 100 && !ended_; ++i) drain(10);  // the rest of the output
  return exit_code_;
}

void LockstepProcess::signal(int signal_number) {
  if (running()) ::kill(pid_, signal_number);
}

void LockstepProcess::kill_group() {
  if (pid_ > 0) ::kill(-pid_, SIGKILL);
}

CommandResult run_lockstep(const std::vector<std::string>& args, const std::string& cwd,
                           double timeout_s, const std::vector<std::string>& env,
                           const std::vector<std::string>& prefix) {
  const auto start = std::chrono::steady_clock::now();
  LockstepProcess process(args, cwd, env, prefix);
  CommandResult result;
  result.exit_code = process.wait(timeout_s);
  process.kill_group();  // anything the run left behind in its group
  result.output = process.output();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
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

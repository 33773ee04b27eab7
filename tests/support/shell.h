#pragma once
// Shell commands and temp folders for tests, header-only so that unit and
// integration tests share them: every command runs under a hard limit
// (`timeout -s KILL`), and a temp folder is removed with its contents when
// the test's scope ends, also after a failed assertion.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace lockstep::testing {

struct ShellResult {
  int exit_code = -1;  // -1: killed (at the limit) or not started
  std::string output;  // stdout, and stderr too where the command says 2>&1
};

// Runs `command` through /bin/sh, at most `timeout_s` seconds.
inline ShellResult shell_output(const std::string& command, int timeout_s = 120) {
  ShellResult result;
  const std::string line = "timeout -s KILL " + std::to_string(timeout_s) + " " + command;
  FILE* pipe = ::popen(line.c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  for (size_t got; (got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) result.output.append(buffer, got);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// `LOCKSTEP_PYTHON <repository>/tests/python/<script> <args>`, at most `timeout_s` seconds.
inline ShellResult python_tool(const std::string& script, const std::string& args, int timeout_s = 120) {
  return shell_output(LOCKSTEP_PYTHON " " + std::string(LOCKSTEP_SOURCE_DIR) + "/tests/python/" + script + " " + args,
                      timeout_s);
}

// A fresh folder under the system temp dir, removed with its contents by the destructor.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "lockstep-test-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace lockstep::testing

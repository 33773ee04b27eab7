#pragma once
// Several machines on this one, for tests: each host is a Linux network
// namespace with one veth link ("eth0", a private address 10.77.0.N/24)
// into a bridge that lives in a namespace of its own. Nothing is added to
// the root namespace and no host has a route out. A process started on a
// host gets its own host name (UTS namespace) and its own /etc/hosts (a
// private mount namespace), in which its name resolves to its address, to
// 127.0.1.1 (Debian's default) or not at all.
//
// Needs root and iproute2: unavailable() says why not, for GTEST_SKIP. The
// destructor deletes every namespace it made, also after a failed
// assertion; a run killed before that is cleaned up by the next NetHosts
// (namespaces whose creating process is gone).
#include <string>
#include <vector>

namespace lockstep::testing {

class NetHosts {
 public:
  enum class Names { kResolvable, kLoopback, kUnresolvable };

  // `files_dir` holds the hosts files (a test's TempDir).
  explicit NetHosts(const std::string& files_dir);
  ~NetHosts();
  NetHosts(const NetHosts&) = delete;
  NetHosts& operator=(const NetHosts&) = delete;

  // "" when namespace hosts can be built here, else the reason.
  static std::string unavailable();

  // Adds a host named `name` (also its host name unless `hostname` is
  // given: a replacement that takes an earlier host's name); returns its
  // address. Throws on failure.
  std::string add(const std::string& name, Names names = Names::kResolvable,
                  const std::string& hostname = "");
  std::string address(const std::string& name) const;
  // On host `name`, `alias` resolves to `address` (a DNS name such as a
  // Kubernetes Service's).
  void alias(const std::string& name, const std::string& alias, const std::string& address);

  struct Mount {
    std::string source, target;  // a folder of this machine; an existing folder on the host
  };
  // The command prefix that runs a program on host `name` (see
  // LockstepProcess), with `mounts` bound into its mount namespace only.
  std::vector<std::string> on(const std::string& name, const std::vector<Mount>& mounts = {}) const;
  // Cuts host `name` off the bridge (its port goes down), or joins it again.
  void cut(const std::string& name);
  void restore(const std::string& name);
  // Caps the host's link to `rate` (tc tbf syntax: "100mbit") both ways; "" removes it.
  void cap(const std::string& name, const std::string& rate);

 private:
  struct Host {
    std::string name, hostname, netns, address, port, hosts_file;
  };
  const Host& host(const std::string& name) const;
  std::string files_dir_;
  std::string prefix_;  // of every namespace this object makes
  std::string bridge_ns_;
  std::vector<Host> hosts_;
};

// Runs `command` through /bin/sh; returns its exit status. Output goes to
// the test's log.
int shell(const std::string& command);

}  // namespace lockstep::testing

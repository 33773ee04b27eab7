#include "support/net_hosts.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "support/shell.h"

namespace lockstep::testing {
namespace {

void run_or_throw(const std::string& command) {
  if (shell(command) != 0) throw std::runtime_error("namespace host set-up failed: " + command);
}

// Namespaces named lskPID-... whose process PID is gone: left by a test
// that was killed before its destructor ran.
void remove_stale_namespaces() {
  const std::string list = shell_output("ip netns list 2>/dev/null", 30).output;
  std::regex pattern("^(lsk([0-9]+)-[a-z0-9-]+)");
  std::smatch match;
  std::string line;
  for (std::istringstream in(list); std::getline(in, line);)
    if (std::regex_search(line, match, pattern)) {
      const pid_t pid = pid_t(std::stol(match[2]));
      if (::kill(pid, 0) != 0 && errno == ESRCH) shell("ip netns del " + match[1].str());
    }
}

}  // namespace

int shell(const std::string& command) {
  const int status = std::system((command + " 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::string NetHosts::unavailable() {
  if (::geteuid() != 0) return "namespace hosts need root (CI runs as root)";
  if (shell("command -v ip >/dev/null && command -v unshare >/dev/null") != 0)
    return "iproute2 (ip) or util-linux (unshare) is missing: bash deploy/install-deps.sh";
  const std::string probe = "lsk" + std::to_string(::getpid()) + "-probe";
  if (shell("ip netns add " + probe + " >/dev/null") != 0)
    return "`ip netns add` fails here (no network namespaces in this kernel or sandbox)";
  shell("ip netns del " + probe);
  return "";
}

NetHosts::NetHosts(const std::string& files_dir) : files_dir_(files_dir) {
  static int made = 0;
  remove_stale_namespaces();
  prefix_ = "lsk" + std::to_string(::getpid()) + "-" + std::to_string(made++);
  bridge_ns_ = prefix_ + "-br";
  run_or_throw("ip netns add " + bridge_ns_);
  run_or_throw("ip -n " + bridge_ns_ + " link add br0 type bridge");
  run_or_throw("ip -n " + bridge_ns_ + " link set br0 up");
}

NetHosts::~NetHosts() {
  for (const auto& h : hosts_) shell("ip netns del " + h.netns);
  shell("ip netns del " + bridge_ns_);
}

std::string NetHosts::add(const std::string& name, Names names, const std::string& hostname) {
  for (const auto& h : hosts_)
    if (h.name == name) throw std::invalid_argument("there is a namespace host named " + name + " already");
  Host h;
  const int index = int(hosts_.size()) + 1;
  h.name = name;
  h.hostname = hostname.empty() ? name : hostname;
  h.netns = prefix_ + "-h" + std::to_string(index);
  h.address = "10.77.0." + std::to_string(index);
  h.port = "p" + std::to_string(index);
  run_or_throw("ip netns add " + h.netns);
  run_or_throw("ip link add eth0 netns " + h.netns + " type veth peer name " + h.port + " netns " +
               bridge_ns_);
  run_or_throw("ip -n " + bridge_ns_ + " link set " + h.port + " master br0");
  run_or_throw("ip -n " + bridge_ns_ + " link set " + h.port + " up");
  run_or_throw("ip -n " + h.netns + " addr add " + h.address + "/24 dev eth0");
  run_or_throw("ip -n " + h.netns + " link set eth0 up");
  run_or_throw("ip -n " + h.netns + " link set lo up");
  h.hosts_file = files_dir_ + "/hosts-" + name;
  std::ofstream hosts(h.hosts_file);
  hosts << "127.0.0.1 localhost\n::1 localhost\n";
  if (names == Names::kResolvable) hosts << h.address << " " << h.hostname << "\n";
  if (names == Names::kLoopback) hosts << "127.0.1.1 " << h.hostname << "\n";
  hosts_.push_back(h);
  return h.address;
}

const NetHosts::Host& NetHosts::host(const std::string& name) const {
  for (const auto& h : hosts_)
    if (h.name == name) return h;
  throw std::invalid_argument("no namespace host named " + name);
}

std::string NetHosts::address(const std::string& name) const { return host(name).address; }

void NetHosts::alias(const std::string& name, const std::string& alias, const std::string& address) {
  std::ofstream(host(name).hosts_file, std::ios::app) << address << " " << alias << "\n";
}

std::vector<std::string> NetHosts::on(const std::string& name, const std::vector<Mount>& mounts) const {
  const Host& h = host(name);
  // ip netns exec and unshare both exec: the pid is the program's own.
  std::vector<std::string> prefix = {
      "ip", "netns", "exec", h.netns, "unshare", "--uts", "--mount", "--propagation", "private",
      "--", "/bin/sh", "-c",
      "hostname \"$0\" && mount --bind \"$1\" /etc/hosts && n=$2 && shift 2 && "
      "while [ \"$n\" -gt 0 ]; do mount --bind \"$1\" \"$2\" || exit 125; shift 2; n=$((n - 1)); "
      "done && exec \"$@\"",
      h.hostname, h.hosts_file, std::to_string(mounts.size())};
  for (const auto& m : mounts) {
    prefix.push_back(m.source);
    prefix.push_back(m.target);
  }
  return prefix;
}

void NetHosts::cut(const std::string& name) {
  run_or_throw("ip -n " + bridge_ns_ + " link set " + host(name).port + " down");
}

void NetHosts::restore(const std::string& name) {
  run_or_throw("ip -n " + bridge_ns_ + " link set " + host(name).port + " up");
}

void NetHosts::cap(const std::string& name, const std::string& rate) {
  const Host& h = host(name);
  for (const auto& [ns, dev] : {std::pair{bridge_ns_, h.port}, std::pair{h.netns, std::string("eth0")}}) {
    shell("ip netns exec " + ns + " tc qdisc del dev " + dev + " root >/dev/null 2>&1");
    if (!rate.empty())
      run_or_throw("ip netns exec " + ns + " tc qdisc add dev " + dev + " root tbf rate " + rate +
                   " burst 256kbit latency 400ms");
  }
}

}  // namespace lockstep::testing

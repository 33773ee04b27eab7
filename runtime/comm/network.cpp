#include "runtime/comm/network.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "runtime/job/config.h"
#include "runtime/base/errors.h"

namespace lockstep {
namespace {

std::string numeric(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (address->sa_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text, sizeof text);
  else if (address->sa_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text,
                sizeof text);
  return text;
}

// "address:port" of a socket address; an IPv4 address mapped into IPv6
// reads as IPv4, so that both spellings of one endpoint compare equal.
std::string endpoint(const sockaddr* address) {
  if (address->sa_family == AF_INET)
    return numeric(address) + ":" + std::to_string(ntohs(reinterpret_cast<const sockaddr_in*>(address)->sin_port));
  const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
  std::string text = numeric(address);
  if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) text = text.substr(text.rfind(':') + 1);
  return text + ":" + std::to_string(ntohs(v6->sin6_port));
}

bool is_loopback_address(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1";
}

struct Resolved {
  std::string address;
  const LocalAddress* local = nullptr;
};

// One item of comm.interface or GLOO_SOCKET_IFNAME: an interface (its IPv4
// address first) or one of this host's addresses.
Resolved resolve_item(const std::string& item, const std::vector<LocalAddress>& here,
                      const std::string& where) {
  const LocalAddress* by_name = nullptr;
  for (const auto& a : here) {
    if (a.address == item) return {a.address, &a};
    if (a.interface == item && (!by_name || (by_name->address.find(':') != std::string::npos &&
                                             a.address.find(':') == std::string::npos)))
      by_name = &a;
  }
  if (by_name) return {by_name->address, by_name};
  throw InputError(where + " names '" + item + "', which is neither an interface nor an address " +
                   "of this host (" + ::lockstep::describe_local_addresses(here) +
                   "); name one of those");
}

}  // namespace

std::vector<LocalAddress> local_addresses() {
  std::vector<LocalAddress> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* item = list; item; item = item->ifa_next) {
    if (!item->ifa_addr || !(item->ifa_flags & IFF_UP)) continue;
    const int family = item->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(item->ifa_addr)->sin6_addr))
      continue;  // needs a scope id to bind; never what peers dial
    LocalAddress a;
    a.interface = item->ifa_name;
    a.address = numeric(item->ifa_addr);
    a.loopback = (item->ifa_flags & IFF_LOOPBACK) || is_loopback_address(a.address);
    out.push_back(a);
  }
  ::freeifaddrs(list);
  return out;
}

std::string describe_local_addresses(const std::vector<LocalAddress>& addresses) {
  std::string text;
  for (const auto& a : addresses)
    text += (text.empty() ? "" : ", ") + a.interface + " (" + a.address + ")";
  return text.empty() ? "no interface is up" : "interfaces here: " + text;
}

std::string route_source_address(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_family = AF_UNSPEC;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int error = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); error != 0)
    throw RunError("the rendezvous store's host '" + host + "' does not resolve (" +
                   ::gai_strerror(error) + ")");
  std::string last_error = "no address";
  for (addrinfo* a = found; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // connect() on a UDP socket only picks the route: nothing is sent.
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      sockaddr_storage local{};
      socklen_t length = sizeof local;
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
        ::close(fd);
        ::freeaddrinfo(found);
        return numeric(reinterpret_cast<sockaddr*>(&local));
      }
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  throw RunError("no route from this host to the rendezvous store at " + host + ":" + service +
                 " (" + last_error + ")");
}

bool resolves_to_loopback(const std::string& host) {
  if (host == "localhost" || is_loopback_address(host) || host == "[::1]") return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  const bool loopback = found && is_loopback_address(numeric(found->ai_addr));
  ::freeaddrinfo(found);
  return loopback;
}

GlooAddressChoice choose_gloo_addresses(const GlooAddressRequest& request) {
  const std::vector<LocalAddress> here = local_addresses();
  const bool store_local = resolves_to_loopback(request.store_host);
  const std::string store = request.store_host + ":" + std::to_string(request.store_port);
  GlooAddressChoice choice;

  std::string setting, where;
  if (!request.socket_ifname.empty()) {
    setting = request.socket_ifname;
    where = "GLOO_SOCKET_IFNAME";
  } else if (!request.comm_interface.empty()) {
    setting = request.comm_interface;
    where = "comm.interface";
  }
  if (!setting.empty()) {
    const auto items = split_names(setting);
    if (items.empty()) throw InputError(where + " = '" + setting + "' names no interface");
    std::string named;
    for (const auto& item : items) {
      Resolved r = resolve_item(item, here, where);
      if (r.local->loopback && !store_local)
        throw InputError(where + " = '" + setting + "' binds Gloo to loopback (" + r.address +
                         ") while the rendezvous store is at " + store +
                         ": ranks on other hosts could not connect; name the interface that "
                         "reaches them (" + describe_local_addresses(here) + ")");
      choice.addresses.push_back(r.address);
      named += (named.empty() ? "" : ", ") + r.local->interface;
    }
    for (const auto& a : choice.addresses) choice.value += (choice.value.empty() ? "" : ", ") + a;
    choice.reason = named + "; " + where + " = " + setting;
    if (where == "GLOO_SOCKET_IFNAME" && !request.comm_interface.empty())
      choice.reason += " (this host's setting, over comm.interface = " + request.comm_interface + ")";
    return choice;
  }
  if (store_local) {
    choice.addresses = {"127.0.0.1"};
    choice.value = "127.0.0.1";
    choice.reason = "lo; the rendezvous store is on loopback (" + store + "), so every rank is on this host";
    return choice;
  }
  const std::string source = route_source_address(request.store_host, request.store_port);
  std::string interface = "?";
  for (const auto& a : here)
    if (a.address == source) interface = a.interface;
  if (is_loopback_address(source))
    throw InputError("the route to the rendezvous store at " + store + " leaves through loopback (" +
                     source + "): ranks on other hosts could not connect to this one; set "
                     "comm.interface or GLOO_SOCKET_IFNAME (" + describe_local_addresses(here) + ")");
  choice.addresses = {source};
  choice.value = source;
  choice.reason = interface + "; the route to the store at " + store;
  return choice;
}

PeerConnections::PeerConnections(const std::string& coordinator_host, int coordinator_port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_family = AF_UNSPEC;
  addrinfo* found = nullptr;
  std::string host = coordinator_host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (::getaddrinfo(host.c_str(), std::to_string(coordinator_port).c_str(), &hints, &found) == 0) {
    for (addrinfo* a = found; a; a = a->ai_next) kept_.push_back(endpoint(a->ai_addr));
    ::freeaddrinfo(found);
  }
}

int PeerConnections::shut_down() const {
  // Without the coordinator's address nothing can be told apart: shutting
  // its connection too would end this process's heartbeat.
  if (kept_.empty()) return 0;
  DIR* fds = ::opendir("/proc/self/fd");
  if (!fds) return 0;
  int count = 0;
  while (dirent* entry = ::readdir(fds)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(fds)) continue;
    int type = 0, listening = 0;
    socklen_t length = sizeof type;
    if (::getsockopt(int(fd), SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM) continue;
    length = sizeof listening;
    if (::getsockopt(int(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0 || listening) continue;
    sockaddr_storage peer{};
    length = sizeof peer;
    if (::getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &length) != 0) continue;
    if (peer.ss_family != AF_INET && peer.ss_family != AF_INET6) continue;
    const std::string other = endpoint(reinterpret_cast<const sockaddr*>(&peer));
    if (std::find(kept_.begin(), kept_.end(), other) != kept_.end()) continue;
    if (::shutdown(int(fd), SHUT_RDWR) == 0) ++count;
  }
  ::closedir(fds);
  return count;
}

}  // namespace lockstep

#pragma once
// Which local address a rank's Gloo pairs listen on. Other ranks connect to
// the address each rank advertises through the store, so it must be one
// they can reach: LibTorch's own default (the address the host name
// resolves to, loopback when it does not resolve or resolves to 127.0.1.1)
// fails across machines. Torch-free; reads no environment.
#include <string>
#include <vector>

namespace lockstep {

struct LocalAddress {
  std::string interface;  // e.g. eth0
  std::string address;    // numeric, IPv4 or IPv6
  bool loopback = false;
};

// Every address configured on this host's interfaces that are up.
std::vector<LocalAddress> local_addresses();

// "lo (127.0.0.1), eth0 (10.1.2.3)": for error messages.
std::string describe_local_addresses(const std::vector<LocalAddress>& addresses);

// The local address of the route by which this host reaches host:port
// (a name or an address). Sends nothing: a UDP socket is connected and
// asked for its own address. Throws RunError when the host does not
// resolve or no route leads there.
std::string route_source_address(const std::string& host, int port);

// True when `host` (a name or an address) resolves to a loopback address.
bool resolves_to_loopback(const std::string& host);

struct GlooAddressRequest {
  std::string comm_interface;   // comm.interface: an interface name or an address; "" = unset
  std::string socket_ifname;    // GLOO_SOCKET_IFNAME of this process, comma list; "" = unset
  std::string store_host;       // where this rank reaches the rendezvous store
  int store_port = 0;
};

struct GlooAddressChoice {
  std::vector<std::string> addresses;  // one Gloo device each, in order
  std::string value;                   // for the Decision line: "10.1.2.3"
  std::string reason;                  // "eth0; the route to the store at 10.1.2.1"
};

// GLOO_SOCKET_IFNAME wins (it is this host's own setting), then
// comm.interface, then the route to the store; loopback only when the
// store is on loopback. Throws InputError for an interface or address this
// host does not have (listing those it has) and for a loopback address
// while the store is elsewhere (naming the fix).
GlooAddressChoice choose_gloo_addresses(const GlooAddressRequest& request);

// The TCP connections this process holds to its peers (Gloo's pairs), that
// is every connected stream socket except those to the coordinator. A peer
// behind a cut link or frozen by SIGSTOP sends nothing, not even a FIN, so
// a collective waiting on it waits out comm.collective_timeout_s; after
// shut_down() every send or receive on those connections fails at once,
// and the collective with it. For the end of a generation, when the
// process groups are about to be dropped anyway.
class PeerConnections {
 public:
  // `coordinator_host:coordinator_port`: the connection kept (resolved now,
  // so that shutting down needs no name service).
  PeerConnections(const std::string& coordinator_host, int coordinator_port);
  // Shuts every other connected TCP socket down both ways; returns how many.
  int shut_down() const;
  // The kept endpoints, "address:port" each (for the log).
  const std::vector<std::string>& kept() const { return kept_; }

 private:
  std::vector<std::string> kept_;
};

}  // namespace lockstep

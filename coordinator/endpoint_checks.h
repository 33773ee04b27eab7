#pragma once
// Checks of what a coordinator or worker is pointed at, made before
// anything listens or dials: a mistake here is bad input (InputError,
// exit 2) naming the flag and the file, never a timeout or "address in
// use" later.
#include <string>

namespace lockstep {

// HOST:PORT or [IPv6]:PORT with a port 0..65535 (0: any free one) and,
// with `must_resolve`, a host that resolves now. `flag` names where it came
// from (--listen). A worker's --coordinator need not resolve yet: its
// name may appear later (a Kubernetes Service), and the worker retries.
void check_host_port(const std::string& address, const std::string& flag, bool must_resolve = true);

// check_host_port, and the host is an address of this machine that a
// socket can be bound to now (any port): "10.255.255.1:0" on a host
// without that address is bad input before any run folder exists. An
// empty host ("":PORT, ":0") means every address and passes.
void check_listen_address(const std::string& address, const std::string& flag);

// A PEM certificate (--tls-cert) and the private key that belongs to it
// (--tls-key).
void check_tls_pair(const std::string& cert_file, const std::string& key_file);

// A PEM file of at least one CA certificate (--tls-ca).
void check_tls_ca(const std::string& ca_file);

}  // namespace lockstep

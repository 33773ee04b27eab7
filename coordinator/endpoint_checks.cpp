#include "coordinator/endpoint_checks.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <memory>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "runtime/base/errors.h"
#include "runtime/run/run_folder.h"

namespace lockstep {
namespace {

std::string openssl_reason() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM block found";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioFree> memory_bio(const std::string& text) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

std::unique_ptr<X509, X509Free> read_certificate(const std::string& text) {
  auto bio = memory_bio(text);
  return std::unique_ptr<X509, X509Free>(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

}  // namespace

void check_host_port(const std::string& address, const std::string& flag, bool must_resolve) {
  const std::string usage = "; give HOST:PORT (e.g. 10.0.0.5:29400, or 127.0.0.1:0 for any free port)";
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw InputError(flag + " '" + address + "': no port" + usage);
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  else if (host.find(':') != std::string::npos)
    throw InputError(flag + " '" + address + "': an IPv6 host goes in brackets, [::1]:PORT" + usage);
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) ||
      std::stoi(port) > 65535)
    throw InputError(flag + " '" + address + "': port '" + port + "' is not a number from 0 to 65535" + usage);
  if (!must_resolve) return;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found) ::freeaddrinfo(found);
  if (error != 0)
    throw InputError(flag + " '" + address + "': host '" + host + "' does not resolve (" +
                     gai_strerror(error) + ")" + usage);
}

void check_listen_address(const std::string& address, const std::string& flag) {
  const auto colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.empty()) {  // every address of this host
    check_host_port("0.0.0.0" + address.substr(colon == std::string::npos ? address.size() : colon), flag, false);
    return;
  }
  check_host_port(address, flag);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "0", &hints, &found) != 0 || !found) return;  // said by check_host_port
  std::string why;
  bool bindable = false;
  for (addrinfo* a = found; a && !bindable; a = a->ai_next) {
    const int probe = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) continue;
    bindable = ::bind(probe, a->ai_addr, a->ai_addrlen) == 0;
    if (!bindable) why = std::strerror(errno);
    ::close(probe);
  }
  ::freeaddrinfo(found);
  if (!bindable)
    throw InputError(flag + " '" + address + "': cannot listen on host '" + host + "' (" + why +
                     "): not an address of this machine? Give one of its own addresses, or 0.0.0.0 for all");
}

void check_tls_pair(const std::string& cert_file, const std::string& key_file) {
  const std::string cert_text = read_text_file(cert_file, "--tls-cert", 1 << 20);
  const std::string key_text = read_text_file(key_file, "--tls-key", 1 << 20);
  auto cert = read_certificate(cert_text);
  if (!cert)
    throw InputError("--tls-cert " + cert_file + ": not a PEM certificate (" + openssl_reason() + ")");
  auto bio = memory_bio(key_text);
  std::unique_ptr<EVP_PKEY, KeyFree> key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key)
    throw InputError("--tls-key " + key_file + ": not a PEM private key without a passphrase (" +
                     openssl_reason() + ")");
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    throw InputError("--tls-key " + key_file + " does not belong to the certificate in --tls-cert " +
                     cert_file + "; give the key it was made with");
  }
}

void check_tls_ca(const std::string& ca_file) {
  const std::string text = read_text_file(ca_file, "--tls-ca", 4 << 20);
  if (!read_certificate(text))
    throw InputError("--tls-ca " + ca_file + ": not a PEM certificate (" + openssl_reason() +
                     "); give the CA certificate that signed the coordinator's --tls-cert");
}

}  // namespace lockstep

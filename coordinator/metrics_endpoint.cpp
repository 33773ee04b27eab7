#include "coordinator/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <vector>

#include <spdlog/spdlog.h>

#include "runtime/base/errors.h"

namespace lockstep {
namespace {

// Label values escaped as the text format asks: backslash, quote, newline.
std::string label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string prometheus_text(const v1::StatusReply& s) {
  std::ostringstream out;
  out.precision(17);
  const std::string run = "run=\"" + label(s.run_id()) + "\"";
  auto gauge = [&](const std::string& name, const std::string& help, const std::string& type) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  };
  gauge("lockstep_up", "1 for the job's current state", "gauge");
  out << "lockstep_up{" << run << ",state=\"" << label(s.state()) << "\"} 1\n";
  const std::pair<const char*, std::pair<const char*, double>> job[] = {
      {"lockstep_world_size", {"ranks the job trains on", s.world_size()}},
      {"lockstep_joined_workers", {"workers joined so far", s.joined()}},
      {"lockstep_generation", {"the current generation (1 + restarts)", double(s.generation())}},
      {"lockstep_first_drift_step", {"the first audited step where the ranks were apart; -1 none", double(s.first_drift_step())}},
  };
  for (const auto& [name, what] : job) {
    gauge(name, what.first, "gauge");
    out << name << "{" << run << "} " << what.second << "\n";
  }
  const std::pair<const char*, std::pair<const char*, double>> counters[] = {
      {"lockstep_restarts_total", {"generations restarted", s.restarts()}},
      {"lockstep_audits_total", {"audited steps", double(s.audits())}},
      {"lockstep_audit_disagreements_total", {"audits that found the ranks apart", double(s.audit_disagreements())}},
      {"lockstep_bad_files_skipped_total", {"data files left out (data.bad_files = skip)", double(s.bad_files_skipped())}},
      {"lockstep_skipped_steps_total", {"optimizer steps that trained nothing (scaler inf/NaN, no valid target)", double(s.skipped_steps())}},
  };
  for (const auto& [name, what] : counters) {
    gauge(name, what.first, "counter");
    out << name << "{" << run << "} " << what.second << "\n";
  }
  struct PerRank {
    const char* name;
    const char* help;
    double (*value)(const v1::RankStatus&);
  };
  const PerRank per_rank[] = {
      {"lockstep_rank_step", "optimizer steps the rank finished", [](const v1::RankStatus& r) { return double(r.step()); }},
      {"lockstep_rank_loss", "the latest mean training loss over the global batch",
       [](const v1::RankStatus& r) { return r.loss(); }},
      {"lockstep_rank_samples_per_second", "global samples per second, recent window",
       [](const v1::RankStatus& r) { return r.samples_per_s(); }},
      {"lockstep_rank_heartbeat_age_seconds", "seconds since the rank's last heartbeat",
       [](const v1::RankStatus& r) { return r.heartbeat_age_s(); }},
  };
  for (const auto& series : per_rank) {
    gauge(series.name, series.help, "gauge");
    for (const auto& r : s.ranks())
      out << series.name << "{" << run << ",rank=\"" << r.rank() << "\",host=\"" << label(r.host()) << "\"} "
          << series.value(r) << "\n";
  }
  return out.str();
}

MetricsEndpoint::MetricsEndpoint(const std::string& host_port, std::function<v1::StatusReply()> status)
    : status_(std::move(status)) {
  const auto colon = host_port.rfind(':');
  if (colon == std::string::npos)
    throw InputError("--metrics " + host_port + ": HOST:PORT is needed (127.0.0.1:9400; port 0: any free port)");
  std::string host = host_port.substr(0, colon);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  const std::string port = host_port.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535)
    throw InputError("--metrics " + host_port + ": port '" + port + "' is not a number from 0 to 65535");
  addrinfo hints{}, *found = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), host_port.substr(colon + 1).c_str(), &hints, &found) != 0 ||
      !found)
    throw InputError("--metrics " + host_port + ": not an address this host can listen on");
  listener_ = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool bound = listener_ >= 0 && ::bind(listener_, found->ai_addr, found->ai_addrlen) == 0 &&
                     ::listen(listener_, 64) == 0;
  const int error = errno;
  ::freeaddrinfo(found);
  if (!bound) {
    if (listener_ >= 0) ::close(listener_);
    throw InputError("--metrics " + host_port + ": cannot listen (" + std::strerror(error) + ")");
  }
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
  port_ = ntohs(address.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&address)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  thread_ = std::thread([this] { serve(); });
  spdlog::info("coordinator: metrics on http://{}:{}/metrics (Prometheus text format)", host.empty() ? "*" : host, port_);
}

MetricsEndpoint::~MetricsEndpoint() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (listener_ >= 0) ::close(listener_);
}

namespace {

// One scraper's connection: its request as it arrives, then the answer as
// it leaves; both within one deadline set at accept.
struct Client {
  int fd = -1;
  std::string request, response;
  size_t sent = 0;
  std::chrono::steady_clock::time_point deadline;
};

constexpr auto kRequestDeadline = std::chrono::seconds(2);  // accept to the last byte sent
constexpr size_t kMaxClients = 64;       // past this the oldest connection is dropped
constexpr size_t kMaxRequestBytes = 16384;

}  // namespace

// Every connection is served from one poll set, without blocking on any
// one of them: a client that trickles its request, or reads the answer
// slowly, holds only its own slot until its deadline, never the next
// scraper.
void MetricsEndpoint::serve() {
  using Clock = std::chrono::steady_clock;
  std::vector<Client> clients;
  while (!stopping_) {
    std::vector<pollfd> fds{{listener_, POLLIN, 0}};
    for (const auto& c : clients) fds.push_back({c.fd, short(c.response.empty() ? POLLIN : POLLOUT), 0});
    ::poll(fds.data(), fds.size(), 200);
    const auto now = Clock::now();
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = clients[i];
      const short events = fds[i + 1].revents;
      if (c.response.empty() && (events & (POLLIN | POLLHUP | POLLERR))) {
        char buffer[2048];
        const ssize_t got = ::recv(c.fd, buffer, sizeof buffer, 0);
        if (got > 0) c.request.append(buffer, size_t(got));
        const bool whole = c.request.find("\r\n\r\n") != std::string::npos || c.request.size() >= kMaxRequestBytes;
        if (whole || got == 0) c.response = answer(c.request);
        if (got < 0 && errno != EAGAIN && errno != EINTR) c.deadline = now;  // broken: drop it
      } else if (!c.response.empty() && (events & (POLLOUT | POLLHUP | POLLERR))) {
        const ssize_t n = ::send(c.fd, c.response.data() + c.sent, c.response.size() - c.sent, MSG_NOSIGNAL);
        if (n > 0) c.sent += size_t(n);
        else if (errno != EAGAIN && errno != EINTR) c.deadline = now;
      }
    }
    // Answered, broken or out of time: closed.
    for (size_t i = 0; i < clients.size();) {
      Client& c = clients[i];
      const bool done = !c.response.empty() && c.sent == c.response.size();
      if (done || now >= c.deadline) {
        ::close(c.fd);
        clients.erase(clients.begin() + long(i));
      } else {
        ++i;
      }
    }
    if (fds[0].revents & POLLIN) {
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        if (clients.size() >= kMaxClients) {  // the oldest has waited longest: it goes
          ::close(clients.front().fd);
          clients.erase(clients.begin());
        }
        clients.push_back({fd, "", "", 0, now + kRequestDeadline});
      }
    }
  }
  for (const auto& c : clients) ::close(c.fd);
}

std::string MetricsEndpoint::answer(const std::string& request) const {
  const bool metrics = request.rfind("GET /metrics ", 0) == 0 || request.rfind("GET /metrics?", 0) == 0;
  const std::string body = metrics ? prometheus_text(status_()) : "not found: the metrics are at /metrics\n";
  return std::string(metrics ? "HTTP/1.1 200 OK\r\n" : "HTTP/1.1 404 Not Found\r\n") +
         "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace lockstep

#include "worker/grpc_store.h"

#include <algorithm>

#include <grpcpp/support/status.h>

#include "lockstep/proto/lockstep.pb.h"
#include "runtime/base/errors.h"
#include "runtime/run/generation.h"
#include "worker/coordinator_client.h"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;
using v1::StoreRequest;

std::string key_list(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 4; ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 4) out += " and " + std::to_string(keys.size() - 4) + " more";
  return out;
}

std::string seconds(std::chrono::milliseconds ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", ms.count() / 1000.0);
  return text;
}

// One call, bounded by `limit`; a failure is a RunError naming the
// operation, the keys and the coordinator.
v1::StoreReply call(CoordinatorClient& client, StoreRequest request, std::chrono::milliseconds limit) {
  v1::StoreReply reply;
  grpc::Status status = client.store(request, &reply, std::max(limit, std::chrono::milliseconds(1)));
  if (!status.ok())
    throw RunError("rendezvous store: " + StoreRequest::Op_Name(request.op()) + " " +
                   key_list({request.keys().begin(), request.keys().end()}) + " at the coordinator " +
                   client.address() + " failed (" + describe(status) + ")");
  return reply;
}

StoreRequest request(const std::string& run_id, StoreRequest::Op op, std::vector<std::string> keys) {
  StoreRequest r;
  r.set_run_id(run_id);
  r.set_op(op);
  for (auto& key : keys) r.add_keys(std::move(key));
  return r;
}

// Repeats a held call (GET, WAIT) until it finds its keys or `timeout`
// has passed; the coordinator holds each one at most 2 s.
v1::StoreReply wait_for(CoordinatorClient& client, StoreRequest r, std::chrono::milliseconds timeout) {
  const auto give_up = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now());
    r.set_wait_ms(std::max<int64_t>(0, std::min<int64_t>(left.count(), 2000)));
    // The call's deadline leaves the coordinator its hold and the
    // network a margin; the loop itself ends at `timeout`.
    v1::StoreReply reply = call(client, r, std::chrono::milliseconds(r.wait_ms()) +
                                               std::min(timeout, std::chrono::milliseconds(10000)));
    if (reply.found()) return reply;
    // A rank lost while the others wait for its key: the coordinator ended
    // the generation, and the wait ends with it.
    throw_if_generation_ended("rendezvous store: waiting for " + key_list({r.keys().begin(), r.keys().end()}));
    if (Clock::now() >= give_up)
      throw RunError("rendezvous store: " + key_list({r.keys().begin(), r.keys().end()}) +
                     " not set at the coordinator " + client.address() + " within " + seconds(timeout) +
                     " s (a rank that should have set it is missing or stuck)");
  }
}

}  // namespace

GrpcStore::GrpcStore(CoordinatorClient& client, std::string run_id, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), client_(client), run_id_(std::move(run_id)) {}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10d::Store> GrpcStore::clone() {
  return c10::make_intrusive<GrpcStore>(client_, run_id_, timeout_);
}
#endif

void GrpcStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  auto r = request(run_id_, StoreRequest::SET, {key});
  r.set_value(std::string(value.begin(), value.end()));
  call(client_, r, timeout_);
}

std::vector<uint8_t> GrpcStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                           const std::vector<uint8_t>& desired) {
  auto r = request(run_id_, StoreRequest::COMPARE_SET, {key});
  r.set_expected(std::string(expected.begin(), expected.end()));
  r.set_value(std::string(desired.begin(), desired.end()));
  const std::string now = call(client_, r, timeout_).value();
  return {now.begin(), now.end()};
}

std::vector<uint8_t> GrpcStore::get(const std::string& key) {
  const std::string value = wait_for(client_, request(run_id_, StoreRequest::GET, {key}), timeout_).value();
  return {value.begin(), value.end()};
}

int64_t GrpcStore::add(const std::string& key, int64_t value) {
  auto r = request(run_id_, StoreRequest::ADD, {key});
  r.set_amount(value);
  return call(client_, r, timeout_).number();
}

bool GrpcStore::deleteKey(const std::string& key) {
  return call(client_, request(run_id_, StoreRequest::DELETE, {key}), timeout_).found();
}

bool GrpcStore::check(const std::vector<std::string>& keys) {
  return call(client_, request(run_id_, StoreRequest::CHECK, keys), timeout_).found();
}

int64_t GrpcStore::getNumKeys() {
  return call(client_, request(run_id_, StoreRequest::NUM_KEYS, {}), timeout_).number();
}

void GrpcStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GrpcStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // c10d's "no timeout" (0) still ends: at the store's own timeout.
  wait_for(client_, request(run_id_, StoreRequest::WAIT, keys), timeout.count() == 0 ? timeout_ : timeout);
}

}  // namespace lockstep

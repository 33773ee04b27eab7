#pragma once
// The worker's side of the coordinator protocol (proto/lockstep.proto): a
// gRPC channel with the job token on every call and a deadline on each.
#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/support/status.h>

#include "lockstep/proto/lockstep.pb.h"
#include "runtime/job/config.h"

namespace grpc {
class Channel;
}

namespace lockstep {

struct ClientOptions {
  std::string address;          // HOST:PORT of the coordinator
  std::string token;            // sent as "lockstep-token"
  std::string tls_ca_file;      // PEM of the CA that signed the server; "" = plaintext
  int max_message_bytes = 1 << 20;
};

class CoordinatorClient {
 public:
  explicit CoordinatorClient(ClientOptions options);
  ~CoordinatorClient();

  grpc::Status join(const v1::JoinRequest& request, v1::JoinReply* reply,
                    std::chrono::milliseconds deadline);
  grpc::Status heartbeat(const v1::HeartbeatRequest& request, v1::HeartbeatReply* reply,
                         std::chrono::milliseconds deadline);
  grpc::Status report(const v1::ReportRequest& request, std::chrono::milliseconds deadline);
  grpc::Status status(v1::StatusReply* reply, std::chrono::milliseconds deadline);
  // One operation on the job's rendezvous store (worker/grpc_store.h).
  grpc::Status store(const v1::StoreRequest& request, v1::StoreReply* reply,
                     std::chrono::milliseconds deadline);
  // Sends the file at `path` as `name` into the coordinator's run folder,
  // in 256 KiB chunks, each with `deadline`.
  grpc::Status put_file(const std::string& run_id, int rank, const std::string& name,
                        const std::string& path, std::chrono::milliseconds deadline);

  // The host part of the address (where the coordinator's store lives too).
  std::string host() const;
  const std::string& address() const { return options_.address; }

 private:
  struct Stub;
  ClientOptions options_;
  std::unique_ptr<Stub> stub_;
};

// "code NAME: message", for logs and errors.
std::string describe(const grpc::Status& status);

// The job the coordinator shipped, rebuilt and validated from its settings.
JobConfig config_from_join(const v1::JoinReply& reply);

}  // namespace lockstep

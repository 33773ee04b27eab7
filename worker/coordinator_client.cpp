#include "worker/coordinator_client.h"

#include <fstream>

#include <grpcpp/grpcpp.h>

#include "lockstep/proto/lockstep.grpc.pb.h"
#include "runtime/base/errors.h"
#include "runtime/run/run_folder.h"

namespace lockstep {
namespace {

const char* code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    default: return "ERROR";
  }
}

}  // namespace

std::string describe(const grpc::Status& status) {
  return std::string(code_name(status.error_code())) + ": " + status.error_message();
}

struct CoordinatorClient::Stub {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Coordinator::Stub> stub;
};

CoordinatorClient::CoordinatorClient(ClientOptions options) : options_(std::move(options)) {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (!options_.tls_ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = read_text_file(options_.tls_ca_file, "--tls-ca");
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(options_.max_message_bytes);
  // A worker started before its coordinator must notice it at once. Three
  // waits add up while it knocks: gRPC's reconnect backoff (to 120 s by
  // default), Join's own pause (join_when_reachable) and, the one that cost
  // about 4 s here, the DNS resolver's cooldown between re-resolutions
  // after a failed connection (even for a numeric address). Held at 500 ms,
  // 250 ms and 100 ms, a worker joins within a second of the coordinator
  // listening (tested); a connection attempt per half second to a port
  // nobody listens on yet costs nothing worth saving.
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  arguments.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 100);
  stub_ = std::make_unique<Stub>();
  stub_->channel = grpc::CreateCustomChannel(options_.address, credentials, arguments);
  stub_->stub = v1::Coordinator::NewStub(stub_->channel);
}

CoordinatorClient::~CoordinatorClient() = default;

namespace {
void prepare(grpc::ClientContext& context, const std::string& token,
             std::chrono::milliseconds deadline) {
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  context.AddMetadata("lockstep-token", token);
}
}  // namespace

grpc::Status CoordinatorClient::store(const v1::StoreRequest& request, v1::StoreReply* reply,
                                      std::chrono::milliseconds deadline) {
  grpc::ClientContext context;
  prepare(context, options_.token, deadline);
  return stub_->stub->Store(&context, request, reply);
}

grpc::Status CoordinatorClient::join(const v1::JoinRequest& request, v1::JoinReply* reply,
                                     std::chrono::milliseconds deadline) {
  grpc::ClientContext context;
  prepare(context, options_.token, deadline);
  return stub_->stub->Join(&context, request, reply);
}

grpc::Status CoordinatorClient::heartbeat(const v1::HeartbeatRequest& request,
                                          v1::HeartbeatReply* reply,
                                          std::chrono::milliseconds deadline) {
  grpc::ClientContext context;
  prepare(context, options_.token, deadline);
  return stub_->stub->Heartbeat(&context, request, reply);
}

grpc::Status CoordinatorClient::report(const v1::ReportRequest& request,
                                       std::chrono::milliseconds deadline) {
  grpc::ClientContext context;
  prepare(context, options_.token, deadline);
  v1::ReportReply reply;
  return stub_->stub->Report(&context, request, &reply);
}

grpc::Status CoordinatorClient::status(v1::StatusReply* reply, std::chrono::milliseconds deadline) {
  grpc::ClientContext context;
  prepare(context, options_.token, deadline);
  return stub_->stub->Status(&context, v1::StatusRequest(), reply);
}

grpc::Status CoordinatorClient::put_file(const std::string& run_id, int rank,
                                         const std::string& name, const std::string& path,
                                         std::chrono::milliseconds deadline) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {grpc::StatusCode::NOT_FOUND, "cannot read " + path};
  v1::FileChunk chunk;
  chunk.set_run_id(run_id);
  chunk.set_rank(rank);
  chunk.set_name(name);
  std::string buffer(256u << 10, '\0');
  int64_t offset = 0;
  for (;;) {
    in.read(buffer.data(), std::streamsize(buffer.size()));
    const auto got = in.gcount();
    chunk.set_offset(offset);
    chunk.set_data(buffer.data(), size_t(got));
    chunk.set_last(in.eof());
    grpc::ClientContext context;
    prepare(context, options_.token, deadline);
    v1::PutFileReply reply;
    if (grpc::Status sent = stub_->stub->PutFile(&context, chunk, &reply); !sent.ok()) return sent;
    offset += got;
    if (chunk.last()) return grpc::Status::OK;
  }
}

std::string CoordinatorClient::host() const {
  auto colon = options_.address.rfind(':');
  std::string host = colon == std::string::npos ? options_.address : options_.address.substr(0, colon);
  if (host.size() > 1 && host.front() == '[') host = host.substr(1, host.size() - 2);
  return host;
}

JobConfig config_from_join(const v1::JoinReply& reply) {
  JobConfig config;
  std::vector<std::string> settings(reply.settings().begin(), reply.settings().end());
  apply_overrides(config, settings);
  for (auto& [key, source] : config.sources) {
    auto shipped = reply.config_sources().find(key);
    source = shipped != reply.config_sources().end() ? shipped->second : "coordinator";
  }
  config.job_file = reply.job_file();
  validate(config);
  describe_global_batch(config);  // resolved by the coordinator; said by the ranks
  return config;
}

}  // namespace lockstep

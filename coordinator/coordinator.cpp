#include "coordinator/coordinator.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "coordinator/key_value_store.h"
#include "lockstep/proto/health.grpc.pb.h"
#include "lockstep/proto/lockstep.grpc.pb.h"
#include "runtime/base/errors.h"
#include "runtime/run/run_folder.h"
#include "runtime/base/untrusted_json.h"

namespace lockstep {
namespace {

bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;  // constant time in the length
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

grpc::Status receive_file_chunk(const std::string& folder, int world_size, const v1::FileChunk& chunk) {
  const int rank = chunk.rank();
  const std::string& name = chunk.name();
  const std::string suffix = "-rank" + std::to_string(rank) + ".jsonl";
  // A rank's TensorBoard file: tensorboard/rank<N>/events.out.tfevents.<a plain name>.
  const std::string board = "tensorboard/rank" + std::to_string(rank) + "/events.out.tfevents.";
  const bool tensorboard = name.size() > board.size() && name.size() <= board.size() + 200 &&
                           name.compare(0, board.size(), board) == 0 &&
                           name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-",
                                                  board.size()) == std::string::npos &&
                           name.find("..", board.size()) == std::string::npos;
  // Step evidence: step-evidence-g<generation>-rank<N>.jsonl.
  const std::string evidence = "step-evidence-g";
  const bool step_evidence = name.size() > evidence.size() + suffix.size() &&
                             name.size() <= evidence.size() + suffix.size() + 12 &&
                             name.compare(0, evidence.size(), evidence) == 0 &&
                             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
                             name.find_first_not_of("0123456789", evidence.size()) == name.size() - suffix.size();
  const bool allowed = rank >= 0 && rank < world_size &&
                       (name == "events" + suffix || name == "audit" + suffix || tensorboard || step_evidence ||
                        (rank == 0 && (name == "manifest.json" || name == "model-final.pt")));
  if (!allowed)
    return {grpc::StatusCode::INVALID_ARGUMENT,
            "rank " + std::to_string(rank) + " may not send '" + name + "' (allowed: events" + suffix +
                ", audit" + suffix + ", step-evidence-g<G>" + suffix + ", " + board + "*" + (rank == 0 ? ", manifest.json, model-final.pt" : "") + ")"};
  if (chunk.data().size() > (256u << 10))
    return {grpc::StatusCode::INVALID_ARGUMENT, "a chunk carries at most 256 KiB"};
  // Chunks arrive in order into a partial file, renamed into place with the last.
  std::error_code error;
  const auto slash = name.rfind('/');
  const std::string subfolder = slash == std::string::npos ? "" : "/" + name.substr(0, slash);
  if (!subfolder.empty()) std::filesystem::create_directories(folder + subfolder, error);
  const std::string partial = folder + subfolder + "/." + name.substr(slash + 1) + ".partial";
  const auto size = std::filesystem::exists(partial) ? std::filesystem::file_size(partial, error) : 0;
  if (chunk.offset() != 0 && uintmax_t(chunk.offset()) != size)
    return {grpc::StatusCode::FAILED_PRECONDITION,
            name + ": chunk at offset " + std::to_string(chunk.offset()) + ", but " +
                std::to_string(size) + " bytes arrived before it (start again at offset 0)"};
  std::ofstream out(partial, chunk.offset() == 0 ? std::ios::binary | std::ios::trunc
                                                 : std::ios::binary | std::ios::app);
  out.write(chunk.data().data(), std::streamsize(chunk.data().size()));
  out.close();
  if (!out) return {grpc::StatusCode::INTERNAL, "cannot write " + partial};
  if (chunk.last()) {
    std::filesystem::rename(partial, folder + "/" + name, error);
    if (error) return {grpc::StatusCode::INTERNAL, "cannot rename " + partial + ": " + error.message()};
    spdlog::info("coordinator: received {} from rank {} ({} bytes)", name, rank,
                 chunk.offset() + int64_t(chunk.data().size()));
  }
  return grpc::Status::OK;
}

namespace {
grpc::Status serve_store_call(KeyValueStore& store, const v1::StoreRequest& request,
                              v1::StoreReply* reply) {
  using Op = v1::StoreRequest;
  const int keys = request.keys_size();
  const bool one_key = request.op() == Op::SET || request.op() == Op::GET || request.op() == Op::ADD ||
                       request.op() == Op::COMPARE_SET || request.op() == Op::DELETE;
  if (one_key && keys != 1)
    return {grpc::StatusCode::INVALID_ARGUMENT, "store operation " + Op::Op_Name(request.op()) +
                                                    " takes exactly one key, not " + std::to_string(keys)};
  // The coordinator holds a waiting call at most this long: a worker asks
  // again until its own timeout, so no handler thread waits for long.
  const auto hold = std::chrono::milliseconds(std::clamp<int64_t>(request.wait_ms(), 0, 2000));
  std::string error;
  switch (request.op()) {
    case Op::SET:
      error = store.set(request.keys(0), request.value());
      break;
    case Op::GET:
      if (auto value = store.get(request.keys(0), hold)) {
        reply->set_found(true);
        reply->set_value(*value);
      }
      break;
    case Op::ADD: {
      int64_t result = 0;
      error = store.add(request.keys(0), request.amount(), &result);
      reply->set_number(result);
      break;
    }
    case Op::COMPARE_SET: {
      std::string now;
      error = store.compare_set(request.keys(0), request.expected(), request.value(), &now);
      reply->set_value(now);
      break;
    }
    case Op::CHECK:
    case Op::WAIT: {
      std::vector<std::string> names(request.keys().begin(), request.keys().end());
      reply->set_found(store.wait(names, request.op() == Op::WAIT ? hold : std::chrono::milliseconds(0)));
      break;
    }
    case Op::DELETE:
      reply->set_found(store.remove(request.keys(0)));
      break;
    case Op::NUM_KEYS:
      reply->set_number(store.size());
      break;
    default:
      return {grpc::StatusCode::INVALID_ARGUMENT,
              "unknown store operation " + std::to_string(request.op()) + " (allowed: SET, GET, ADD, "
              "COMPARE_SET, CHECK, WAIT, DELETE, NUM_KEYS)"};
  }
  if (!error.empty()) return {grpc::StatusCode::RESOURCE_EXHAUSTED, error};
  return grpc::Status::OK;
}
}  // namespace

void add_recovery_costs(const std::string& run_folder, nlohmann::json& restarts, const std::string& time_key) {
  struct Event {
    std::string kind;
    double time;
    int64_t step;
  };
  // Rank 0's resumes and first steps (every generation's), and how far
  // every rank had got when its generation failed under it.
  std::vector<Event> events;
  for (int rank = 0;; ++rank) {
    std::ifstream in(run_folder + "/events-rank" + std::to_string(rank) + ".jsonl");
    if (!in) break;
    for (std::string line; std::getline(in, line);) {
      auto event = parse_untrusted_json(line, nullptr);
      if (event.is_discarded() || !event.is_object()) continue;
      const std::string kind = event.value("event", "");
      const double time = event.value("time", 0.0);
      if (kind == "failed") events.push_back({kind, time, event.value("steps_done", int64_t(0))});
      else if (rank == 0 && (kind == "first_step" || kind == "resumed"))
        events.push_back({kind, time, event.value("step", int64_t(0))});
    }
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) { return a.time < b.time; });
  for (auto& restart : restarts) {
    const double died = restart.value(time_key, 0.0);
    int64_t resumed = 0, reached = restart.value("last_step_reported", int64_t(0));
    double generation_start = 0;  // the first step of the generation that failed
    for (const auto& e : events)
      if (e.kind == "first_step" && e.time <= died) generation_start = e.time;
    for (const auto& e : events) {
      if (e.time <= generation_start) continue;
      if (e.kind == "failed") reached = std::max(reached, e.step);
      if (e.time <= died) continue;
      if (e.kind == "resumed") resumed = e.step;
      if (e.kind != "first_step") continue;
      restart["recovery_s"] = e.time - died;
      restart["resumed_from_step"] = resumed;
      restart["steps_reached"] = reached;
      restart["steps_redone"] = std::max<int64_t>(0, reached - resumed);
      break;
    }
  }
}

std::string read_secret_file(const std::string& path, const std::string& what) {
  std::string text = read_text_file(path, what);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.empty()) throw InputError(what + " " + path + ": the file is empty");
  return text;
}

void validate_token(const std::string& token, const std::string& source) {
  const std::string fix = "; make one with: head -c 24 /dev/urandom | base64";
  if (token.size() < kMinTokenChars)
    throw InputError("the job token from " + source + " has " + std::to_string(token.size()) +
                     " characters; it needs at least " + std::to_string(kMinTokenChars) + fix);
  if (token.size() > 4096)
    throw InputError("the job token from " + source + " has " + std::to_string(token.size()) +
                     " characters; at most 4096" + fix);
  for (size_t i = 0; i < token.size(); ++i) {
    const auto c = static_cast<unsigned char>(token[i]);
    if (c <= 0x20 || c >= 0x7f)
      throw InputError("the job token from " + source + " holds " +
                       (c == ' ' || c == '\t' || c == '\n' || c == '\r' ? std::string("whitespace")
                                                                   : std::string("a control or non-ASCII byte")) +
                       " at position " + std::to_string(i + 1) + "; use printable ASCII only" + fix);
  }
}

std::string redact(const std::string& secret) {
  return secret.substr(0, std::min<size_t>(4, secret.size())) + "…(" +
         std::to_string(secret.size()) + " chars)";
}

// grpc.health.v1.Health/Check: the server as a whole ("") is SERVING.
class CoordinatorServer::HealthService final : public grpc::health::v1::Health::Service {
 public:
  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* reply) override {
    if (!request->service().empty())
      return {grpc::StatusCode::NOT_FOUND, "this server checks its health as a whole: ask for service \"\""};
    reply->set_status(grpc::health::v1::HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }
};

// The gRPC handlers: check the token, then hand over to JobState.
class CoordinatorServer::Service final : public v1::Coordinator::Service {
 public:
  Service(JobState& state, std::string token) : state_(state), token_(std::move(token)) {}

  grpc::Status Join(grpc::ServerContext* context, const v1::JoinRequest* request,
                    v1::JoinReply* reply) override {
    if (auto denied = check_token(*context); !denied.ok()) return denied;
    // The caller's deadline, on the steady clock (no deadline: a day).
    auto left = context->deadline() - std::chrono::system_clock::now();
    auto give_up = JobState::Clock::now() +
                   std::min<std::chrono::system_clock::duration>(left, std::chrono::hours(24));
    return state_.join(*request, context->peer(), give_up, reply,
                       [context] { return context->IsCancelled(); });
  }
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatReply* reply) override {
    if (auto denied = check_token(*context); !denied.ok()) return denied;
    return state_.heartbeat(*request, reply);
  }
  grpc::Status Report(grpc::ServerContext* context, const v1::ReportRequest* request,
                      v1::ReportReply*) override {
    if (auto denied = check_token(*context); !denied.ok()) return denied;
    return state_.report(*request);
  }
  grpc::Status Status(grpc::ServerContext* context, const v1::StatusRequest*,
                      v1::StatusReply* reply) override {
    if (auto denied = check_token(*context); !denied.ok()) return denied;
    state_.status(reply);
    return grpc::Status::OK;
  }
  grpc::Status PutFile(grpc::ServerContext* context, const v1::FileChunk* chunk,
                       v1::PutFileReply*) override {
    if (auto denied = check_token(*context); !denied.ok()) return denied;
    if (chunk->run_id() != state_.run_id())
      return {grpc::StatusCode::NOT_FOUND, "run " + chunk->run_id() + " is not this coordinator's ("
                                               + state_.run_id() + ")"};
    if (folder_.empty()) return {grpc::StatusCode::FAILED_PRECONDITION, "this coordinator keeps no run folder"};
    return receive_file_chunk(folder_, state_.world_size(), *chunk);
  }
  grpc::Status Store(grpc::ServerContext* context, const v1::StoreRequest* request,
                     v1::StoreReply* reply) override {
    if (auto denied = check_token(*context); !denied.ok()) return denied;
    if (request->run_id() != state_.run_id())
      return {grpc::StatusCode::NOT_FOUND, "run " + request->run_id() + " is not this coordinator's ("
                                               + state_.run_id() + ")"};
    return serve_store_call(store_, *request, reply);
  }

  std::string folder_;  // the run folder files are copied into ("" = none)

 private:
  grpc::Status check_token(const grpc::ServerContext& context) {
    const auto& metadata = context.client_metadata();
    auto it = metadata.find("lockstep-token");
    if (it == metadata.end())
      return {grpc::StatusCode::UNAUTHENTICATED,
              "no job token: set LOCKSTEP_TOKEN or --token-file to the coordinator's token"};
    if (!same_secret(std::string(it->second.data(), it->second.size()), token_)) {
      note_refusal(context.peer());
      return {grpc::StatusCode::UNAUTHENTICATED, "wrong job token"};
    }
    return grpc::Status::OK;
  }

  // The first refusal is logged at once, later ones at most once per
  // kRefusalLogPeriod as a count: a flood of bad clients must not flood
  // the log (or the disk under it).
  void note_refusal(const std::string& peer) {
    constexpr auto kRefusalLogPeriod = std::chrono::seconds(10);
    std::lock_guard<std::mutex> lock(refusals_mutex_);
    const auto now = std::chrono::steady_clock::now();
    ++refused_;
    refused_peers_.insert(peer.substr(0, peer.rfind(':')));
    if (now - last_refusal_log_ < kRefusalLogPeriod) return;
    if (refused_ == 1)
      spdlog::warn("coordinator: refused a call from {}: wrong job token (more are counted, one line "
                   "per {} s)", peer, kRefusalLogPeriod.count());
    else
      spdlog::warn("coordinator: refused {} calls with a wrong job token from {} address{} since the "
                   "last such line (latest from {})", refused_, refused_peers_.size(),
                   refused_peers_.size() == 1 ? "" : "es", peer);
    last_refusal_log_ = now;
    refused_ = 0;
    refused_peers_.clear();
  }

  std::mutex refusals_mutex_;
  int64_t refused_ = 0;                   // since the last line logged; guarded by refusals_mutex_
  std::set<std::string> refused_peers_;   // guarded by refusals_mutex_
  std::chrono::steady_clock::time_point last_refusal_log_{};  // guarded by refusals_mutex_

  JobState& state_;
  const std::string token_;
 public:
  KeyValueStore store_;  // the job's rendezvous store
};

CoordinatorServer::CoordinatorServer(CoordinatorOptions options, JobStateOptions job)
    : options_(std::move(options)), job_(std::move(job)) {}

CoordinatorServer::~CoordinatorServer() {
  stopping_ = true;
  if (monitor_.joinable()) monitor_.join();
  if (service_) service_->store_.close();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

void CoordinatorServer::start() {
  started_ = std::chrono::steady_clock::now();
  auto host = options_.listen.substr(0, options_.listen.rfind(':'));
  if (!options_.run_dir.empty()) {
    // The run folder exists from the start, with a marker whose contents
    // every worker gets at Join: one that reads the same in its own run
    // folder shares this one; the others send their files at the end.
    RunFolder folder(options_.run_dir, job_.run_id);
    // One writer per run folder: a second coordinator (a --resume of a run
    // that still runs) would interleave both runs' evidence.
    folder_lock_ = std::make_unique<RunFolderLock>(folder.path());
    folder.create();
    job_.audit_log = folder.file("audit.jsonl");
    job_.folder_marker = job_.run_id + " " + random_hex(16);
    write_file_atomically(folder.file(".coordinator"), job_.folder_marker);
  }
  state_ = std::make_unique<JobState>(job_);
  service_ = std::make_unique<Service>(*state_, options_.token);
  if (!options_.run_dir.empty()) service_->folder_ = RunFolder(options_.run_dir, job_.run_id).path();
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (!options_.tls_cert_file.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({read_secret_file(options_.tls_key_file, "--tls-key"),
                                      read_secret_file(options_.tls_cert_file, "--tls-cert")});
    credentials = grpc::SslServerCredentials(ssl);
  } else {
    credentials = grpc::InsecureServerCredentials();
  }
  // gRPC's own locks are absl::Mutex; Debian's Abseil checks every
  // acquisition for lock-order cycles (a debugging aid), which cost the
  // coordinator a tenth of its time at ten thousand heartbeats a second.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, credentials, &port_);
  builder.RegisterService(service_.get());
  // The standard grpc.health.v1.Health service (SERVING once the port
  // listens): the readiness probe of Kubernetes (`grpc: {port: ...}`) and of
  // grpc_health_probe, on the same port. (gRPC's built-in one opened a
  // second listening port here.) No token: it tells nothing about the job.
  health_ = std::make_unique<HealthService>();
  builder.RegisterService(health_.get());
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_message_bytes);
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0)
    throw RunError("coordinator: cannot listen on " + options_.listen +
                   " (address in use, or not an address of this machine)");
  spdlog::info("coordinator: listening on {}:{} ({}), run {}, waiting for {} workers", host, port_,
               options_.tls_cert_file.empty() ? "plaintext" : "TLS", job_.run_id, job_.world_size);
  spdlog::info("Decision: job token = {} (every call must carry it)", redact(options_.token));
  monitor_ = std::thread([this] {
    while (!stopping_) {
      state_->check_liveness();
      std::this_thread::sleep_for(options_.liveness_period);
    }
  });
}

int CoordinatorServer::wait(std::chrono::milliseconds tell_grace) {
  while (!state_->wait_until_ended(std::chrono::milliseconds(500))) {
  }
  const bool completed = state_->state() == JobState::State::kCompleted;
  const bool stopped = state_->state() == JobState::State::kStopped;
  if (!completed && !stopped) {
    // Live ranks learn of the failure from their next heartbeat: give them
    // a few heartbeat periods to hear it before the server goes away.
    state_->wait_until_told(tell_grace);
  }
  bool manifest_written = true;
  try {
    write_manifest();
  } catch (const std::exception& e) {
    spdlog::error("coordinator: could not write the run's manifest: {}", e.what());
    manifest_written = false;
  }
  stopping_ = true;
  if (monitor_.joinable()) monitor_.join();
  service_->store_.close();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (!manifest_written && (completed || stopped)) {
    spdlog::error("coordinator: run {} trained to its end but its record is incomplete (see above): "
                  "exit 1", job_.run_id);
    return 1;
  }
  if (completed && state_->first_drift_step() >= 0) {
    spdlog::error("coordinator: run {} completed_with_drift: {} (the audit policy kept it training); "
                  "exit {}; details: lockstep audit {}", job_.run_id, state_->drift_summary(),
                  kExitCompletedWithDrift,
                  options_.run_dir.empty() ? job_.run_id : RunFolder(options_.run_dir, job_.run_id).path());
    return kExitCompletedWithDrift;
  }
  if (completed) {
    spdlog::info("coordinator: run {} completed", job_.run_id);
    return 0;
  }
  if (stopped) {
    spdlog::warn("coordinator: run {} stopped after step {}: resume it with --resume {}",
                 job_.run_id, state_->stopped_at_step(),
                 options_.run_dir.empty() ? job_.run_id : RunFolder(options_.run_dir, job_.run_id).path());
    return kExitStopped;
  }
  spdlog::error("coordinator: run {} failed: {}", job_.run_id, state_->failure());
  return 1;
}

void CoordinatorServer::write_manifest() const {
  if (options_.run_dir.empty()) return;
  RunFolder folder(options_.run_dir, job_.run_id);
  nlohmann::json manifest = nlohmann::json::object();
  const std::string path = folder.file("manifest.json");
  if (std::filesystem::exists(path)) {
    std::ifstream in(path);
    manifest = parse_untrusted_json(in, nullptr);
    if (manifest.is_discarded() || !manifest.is_object()) manifest = nlohmann::json::object();
  } else {
    folder.create();
    manifest["run_id"] = job_.run_id;
  }
  manifest["coordinator"] = state_->to_json();
  // The whole job as its coordinator saw it (waiting for workers, restarts,
  // training): a rank's own phases cover only its last generation.
  manifest["job_wall_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  // An elastic job's world size over time, each change with what it cost:
  // from the end of the last generation to the first step of the next, and
  // the steps redone (the step in flight; from a checkpoint, more).
  if (!manifest["coordinator"]["membership"].empty())
    add_recovery_costs(folder.path(), manifest["coordinator"]["membership"], "ended_unix_s");
  nlohmann::json restarts = manifest["coordinator"]["restarts"];
  if (!restarts.empty()) {
    add_recovery_costs(folder.path(), restarts, "died_unix_s");
    manifest["restarts"] = restarts;
    manifest["restart_count"] = restarts.size();
    if (state_->state() == JobState::State::kFailed) manifest["final_failure"] = state_->failure();
    for (const auto& r : restarts) {
      // Figures that could not be measured (no step trained after the
      // restart, evidence on another host) are said so, never printed as -1.
      if (r.contains("recovery_s"))
        spdlog::info("coordinator: restart to generation {} resumed from step {} (generation {} had reached "
                     "step {}): {}; recovery {:.2f} s (death to the first step), {} steps redone",
                     r["generation"].get<int64_t>(), r["resumed_from_step"].get<int64_t>(),
                     r["generation"].get<int64_t>() - 1, r["steps_reached"].get<int64_t>(),
                     r["reason"].get<std::string>(), r["recovery_s"].get<double>(), r["steps_redone"].get<int64_t>());
      else
        spdlog::info("coordinator: restart to generation {}: {}; no step of generation {} was recorded after it "
                     "in {}, so its recovery time and steps redone are not known",
                     r["generation"].get<int64_t>(), r["reason"].get<std::string>(), r["generation"].get<int64_t>(),
                     folder.path());
    }
  }
  if (state_->state() == JobState::State::kCompleted && state_->first_drift_step() >= 0) {
    manifest["status"] = "completed_with_drift";
    manifest["first_drift_step"] = state_->first_drift_step();
    manifest["drift"] = state_->drift_summary();
  }
  if (state_->state() == JobState::State::kStopped) {
    manifest["status"] = "stopped";
    manifest["stopped_at_step"] = state_->stopped_at_step();
    manifest["stop_reason"] = manifest["coordinator"]["stop_reason"];
  }
  if (state_->state() == JobState::State::kFailed) {
    manifest["status"] = state_->cancelled() ? "cancelled" : "failed";
    // The coordinator's failure wins over a rank's: a rank that failed
    // because the job was cancelled under it reports a consequence.
    if (!manifest.contains("error") || state_->cancelled()) manifest["error"] = state_->failure();
  }
  folder.write_manifest(manifest);
  spdlog::info("coordinator: wrote its view into {}", path);
}

}  // namespace lockstep

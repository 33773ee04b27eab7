#pragma once
// The coordinator: a gRPC server that runs one job. It holds the job's
// rendezvous store (served by the Store call, behind the token like every
// other), answers Join/Heartbeat/Report/Status, watches liveness, and at
// the end writes its view into the run folder's manifest.json. It never sees
// a tensor.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/job_state.h"

namespace grpc {
class Server;
}

namespace lockstep {

class RunFolderLock;

// The exit status of a job stopped on request, to be resumed (sysexits'
// EX_TEMPFAIL: "try again later").
constexpr int kExitStopped = 75;
// The exit status of a job that ran to the end while its ranks disagreed at
// an audit (audit.policy = warn or resync kept it training): not a clean run.
constexpr int kExitCompletedWithDrift = 3;

struct CoordinatorOptions {
  std::string listen = "127.0.0.1:0";  // HOST:PORT; port 0 picks a free one
  std::string token;                   // required in every call's "lockstep-token" header
  std::string tls_cert_file;           // PEM; with tls_key_file, serve TLS
  std::string tls_key_file;
  std::string run_dir;                 // where <run-id>/manifest.json goes
  int max_message_bytes = 1 << 20;     // larger requests are refused
  std::chrono::milliseconds liveness_period{200};
};

class CoordinatorServer {
 public:
  CoordinatorServer(CoordinatorOptions options, JobStateOptions job);
  ~CoordinatorServer();

  // Starts the gRPC server. Throws RunError if it cannot listen.
  void start();
  int port() const { return port_; }
  const std::string& run_id() const { return job_.run_id; }
  JobState& job_state() { return *state_; }

  // Blocks until the job ends; after a failure gives live ranks up to
  // `tell_grace` to hear ABORT from their next heartbeat; writes the
  // manifest and stops serving. Returns 0 (completed), 1 (failed),
  // kExitCompletedWithDrift or kExitStopped.
  int wait(std::chrono::milliseconds tell_grace = std::chrono::milliseconds(5000));
  // Fails the job; wait() then returns 1.
  void abort(const std::string& reason) { state_->fail(reason); }
  // Fails it because someone asked (a signal): the manifest says
  // "cancelled" and who asked; wait() returns 1.
  void cancel(const std::string& reason) { state_->cancel(reason); }
  // Stops the job after a step every rank agrees on, with a checkpoint
  // there (JobState::request_stop); wait() then returns kExitStopped.
  void stop(const std::string& reason) { state_->request_stop(reason); }

 private:
  class Service;
  class HealthService;  // grpc.health.v1.Health, for readiness probes
  void write_manifest() const;

  CoordinatorOptions options_;
  JobStateOptions job_;
  std::unique_ptr<JobState> state_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<RunFolderLock> folder_lock_;  // held while this coordinator writes the run folder
  std::thread monitor_;
  std::atomic<bool> stopping_{false};
  int port_ = 0;
  std::chrono::steady_clock::time_point started_{};  // start(): the job's wall time counts from here
};

// Fills each restart's recovery_s (from its `time_key`, the death or the
// generation's end in Unix seconds, to the end of the first step after it),
// resumed_from_step, steps_reached (the most steps a rank had finished when
// the generation failed) and steps_redone, from the run folder's events
// files. Also for an elastic job's membership changes.
void add_recovery_costs(const std::string& run_folder, nlohmann::json& restarts, const std::string& time_key);

// Writes one chunk of a worker's run-folder file into `folder` (the PutFile
// call): only that rank's own files, in order, renamed into place with the
// last chunk. Returns INVALID_ARGUMENT for a name the rank may not send.
grpc::Status receive_file_chunk(const std::string& folder, int world_size, const v1::FileChunk& chunk);

// Reads a file's whole contents; throws InputError naming `what` and the path.
std::string read_secret_file(const std::string& path, const std::string& what);
// "abcd…(32 chars)": enough to tell tokens apart, never the whole secret
// (only tokens validate_token accepted are ever shown, and never a short one).
std::string redact(const std::string& secret);

// The smallest token a job accepts: a short one can be guessed.
constexpr size_t kMinTokenChars = 16;
// Throws InputError naming `source` (--token-file F, LOCKSTEP_TOKEN) when
// the token is shorter than kMinTokenChars, longer than 4096, or holds
// whitespace or characters a gRPC header cannot carry. The message never
// shows the token.
void validate_token(const std::string& token, const std::string& source);

}  // namespace lockstep

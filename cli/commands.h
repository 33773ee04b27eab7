#pragma once
// The subcommands of `lockstep`, each returning its exit code
// (0 success, 1 failed run, 2 bad input; the coordinator's 75: stopped on
// request, kExitStopped in coordinator/coordinator.h). Errors are thrown as InputError /
// RunError and turned into codes by main.
#include <chrono>
#include <string>
#include <vector>

namespace lockstep {

struct ConnectionFlags {
  std::string coordinator;  // HOST:PORT
  std::string token_file;   // else LOCKSTEP_TOKEN
  std::string tls_ca;       // CA to verify the coordinator's certificate
  double rendezvous_timeout_s = 120;  // worker: how long to wait for an unreachable coordinator
};

struct ServeFlags {  // lockstep coordinator
  std::string listen = "127.0.0.1:50051";  // HOST:PORT
  std::string token_file;                  // else LOCKSTEP_TOKEN
  std::string tls_cert, tls_key;           // both, or neither for plaintext
  std::string metrics;                     // HOST:PORT for Prometheus's scrapes; "" = none
  std::string resume_dir;
  std::string run_id;  // the run folder's name; "" for a new one
};

// Shared by the commands that talk to a coordinator.
// --coordinator and --tls-ca, checked before dialling. Throws InputError.
void check_connection(const ConnectionFlags& connection);
// --token-file, else LOCKSTEP_TOKEN; neither is bad input.
std::string resolve_token(const std::string& token_file);

// Files in a `lockstep run` job's folder while it runs: the coordinator's
// address, and the token (0600).
inline constexpr const char* kAddressFile = "coordinator-address";
inline constexpr const char* kTokenFile = ".token";

int run_command(const std::string& job_file, const std::vector<std::string>& overrides, int nproc,
                const std::string& resume_dir, const std::string& metrics_address);
int coordinator_command(const std::string& job_file, const std::vector<std::string>& overrides,
                        const ServeFlags& serve);
int worker_command(const std::string& job_file, const std::vector<std::string>& overrides,
                   const ConnectionFlags& connection, std::chrono::steady_clock::time_point start);
// --coordinator, or RUN_DIR of a `lockstep run` job (its address and token
// are in the folder while it runs; after, the manifest's outcome).
// watch: print again every second until the job ends (redrawn in place on a terminal).
int status_command(ConnectionFlags connection, const std::string& run_dir, bool json, bool watch);
int audit_command(const std::string& run_dir, bool json);
// `lockstep compare RUN_A RUN_B`: 0 bit-identical, 1 different, 2 unreadable.
int compare_command(const std::string& run_a, const std::string& run_b, bool json);

// `lockstep verify RUN_DIR [--steps A:B]`: replays the steps on this
// machine on one rank and compares them with the run's step evidence: 0
// every digest equal, 1 one differs (the first is named: step, microbatch,
// rank) or the evidence is incomplete, 2 bad input.
int verify_command(const std::string& run_dir, const std::string& steps, bool json);

// lockstep probe: the table of what each precision costs here, cached per
// machine fingerprint (--force measures again). With --candidate
// DEVICE:DTYPE: measure that one in this process and print JSON rows (what
// the probe's children run).
// The effective configuration of JOB with --set overrides: a job file with
// each key's source in a comment, or (json) {"config", "sources"}. Checks
// the keys as `run` does; exit 2 on bad input.
int config_command(const std::string& job_file, const std::vector<std::string>& overrides, bool json);

// Every job key with its type, default and allowed values.
int keys_command(bool json);

// lockstep report RUN_DIR... : an HTML page of the runs (overlaid when
// several), or (csv) their per-step figures. output "" = RUN_DIR/report.html
// for one run, ./report.html for several; "-" = stdout. Bad folders: exit 2.
inline constexpr size_t kMaxReportRuns = 4;
int report_command(const std::vector<std::string>& run_dirs, const std::string& output, bool csv);

int probe_command(const std::string& candidate, bool force, bool json);

}  // namespace lockstep

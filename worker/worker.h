#pragma once
// One rank of a job, from rendezvous to the final report: validates its
// input, joins through a Rendezvous, builds the data and control groups,
// seeds and checks, trains, evaluates, and (rank 0) writes the run folder.
#include <chrono>
#include <optional>

#include <nlohmann/json.hpp>

#include "runtime/audit/step_evidence.h"
#include "runtime/checkpoint/state_in_memory.h"
#include "runtime/job/config.h"
#include "runtime/precision/machine.h"
#include "runtime/model/models.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/train/run_observer.h"

namespace lockstep {

struct WorkerOptions {
  // When the process started: start-up time is measured from here.
  std::chrono::steady_clock::time_point process_start = std::chrono::steady_clock::now();
  bool terminal = false;  // rank 0's output goes to a terminal
  RunObserver* observer = nullptr;  // told of phases and steps; may ask to stop
  // A generation after an automatic restart: every rank continues from the
  // newest complete checkpoint of the run folder (step 0 if there is none).
  bool restarted = false;
  int64_t generation = 1;  // for the manifest and the events
  // An elastic job (elastic.min_ranks below the world size): a new
  // generation continues from the state its survivors hold in memory, sent
  // to the ranks that hold none, rather than from a checkpoint.
  bool elastic = false;
  // May be null. The state this process kept from its last generation (in),
  // and the one it keeps when this generation ends under it (out).
  std::optional<StateInMemory>* kept_state = nullptr;
  // This host's own settings, read from its environment by the command front.
  CpuBudget cpu;                   // what this process may use of the CPUs
  std::string gloo_socket_ifname;  // GLOO_SOCKET_IFNAME ("" = unset)
  // `lockstep verify`: the replay's check of a run's evidence instead of
  // recording this run's, and the newest checkpoint it may start from.
  StepEvidence* replay = nullptr;
  int64_t resume_at_most = INT64_MAX;
};

// What a rank reports at the end.
struct WorkerSummary {
  nlohmann::json metrics;
  nlohmann::json decisions;
};

// Runs the job to the end on this rank. Throws InputError for bad input
// (before any process group exists) and RunError when the run fails; rank 0
// then marks manifest.json as failed with the reason. Its input is checked
// first by the start-up checks (runtime/startup/model_checks.h).
WorkerSummary run_worker(const JobConfig& config, Rendezvous& rendezvous, const ModelRegistry& registry,
                const WorkerOptions& options);

}  // namespace lockstep

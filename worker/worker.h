#pragma once
// One rank of a job, from rendezvous to the final report: validates its
// input, joins through a Rendezvous, builds the data and control groups,
// seeds and checks, trains, evaluates, and (rank 0) writes the run folder.
#include <chrono>

#include <nlohmann/json.hpp>

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
  // This host's own settings, read from its environment by the command front.
  CpuBudget cpu;                   // what this process may use of the CPUs
  std::string gloo_socket_ifname;  // GLOO_SOCKET_IFNAME ("" = unset)
};

// What a rank reports at the end.
struct WorkerSummary {
  nlohmann::json metrics;
  nlohmann::json decisions;
};

// Runs the job to the end on this rank. Throws InputError for bad input
// (before any process group exists) and RunError when the run fails; rank 0
// then marks manifest.json as failed with the reason.
// fault.inject must name tensors the model has, precision.fp32_modules its
// modules. Throws InputError (an unknown model.name too).
void check_injected_faults(const JobConfig& config, const ModelRegistry& registry);

struct TrainTestData;
// Before any process group, on one microbatch of the first training batch:
// builds the model, applies the precision policy, checks its parameters
// are finite and its class targets fit, runs one forward and the loss in
// eval mode without gradients in fp32 (a model that rejects the data's
// shape, a model.output that does not exist or a loss that does not fit is
// an InputError quoting the model's message and the input shape tried),
// then one training step's forward and backward and one evaluation forward
// at `precision` (fp32 | bf16). A training step that fails there is an
// InputError naming the phase, the precision and the fixes; an evaluation
// that fails only in bf16 sets `*eval_precision` to "fp32" and adds that
// decision (without `eval_precision`, it is an InputError too).
// Returns the model's decisions (tied and frozen parameters, the output picked).
std::vector<Decision> check_model_on_data(const JobConfig& config, const ModelRegistry& registry,
                                          const TrainTestData& data, const std::string& precision = "fp32",
                                          std::string* eval_precision = nullptr);

WorkerSummary run_worker(const JobConfig& config, Rendezvous& rendezvous, const ModelRegistry& registry,
                const WorkerOptions& options);

}  // namespace lockstep

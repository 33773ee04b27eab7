#include "worker/worker.h"

#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "lockstep/build_config.h"
#include "runtime/comm/control_group.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/state_in_memory.h"
#include "runtime/data/augment.h"
#include "runtime/data/dataset.h"
#include "runtime/data/provenance.h"
#include "runtime/model/digest.h"
#include "runtime/base/errors.h"
#include "runtime/precision/machine.h"
#include "runtime/comm/network.h"
#include "runtime/run/generation.h"
#include "runtime/loss/objective.h"
#include "runtime/train/phase_timer.h"
#include "runtime/run/run_folder.h"
#include "runtime/run/tensorboard.h"
#include "runtime/audit/arithmetic_probe.h"
#include "runtime/audit/seeding.h"
#include "runtime/audit/step_evidence.h"
#include "runtime/precision/probe.h"
#include "runtime/startup/model_checks.h"
#include "runtime/train/trainer.h"

namespace lockstep {
namespace {

using std::chrono::milliseconds;

milliseconds to_ms(double seconds) { return milliseconds(int64_t(seconds * 1000.0)); }

// This process's peak resident memory (VmHWM), in MiB; 0 if unknown.
double peak_rss_mb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0.0;
}

void warn_test_switches(const JobConfig& config, DecisionLog& log) {
  if (config.test.no_reseed)
    log.record("test.no_reseed", "true", "test switch: ranks keep the shared seed, so their "
               "random streams will be equal", /*warn=*/true);
  if (config.test.hold_rank >= 0)
    log.record("test.hold_rank", std::to_string(config.test.hold_rank),
               "test switch: that rank sleeps " + fmt::format("{:g}", config.test.hold_s) +
                   " s before the start barrier", /*warn=*/true);
  if (config.test.fail_rank >= 0)
    log.record("test.fail_rank", std::to_string(config.test.fail_rank),
               "test switch: that rank fails (" + config.test.fail_kind + ") at step " +
                   std::to_string(config.test.fail_step), /*warn=*/true);
}

}  // namespace

namespace {

// Checkpoints are written by rank 0 (model, optimizer) and by every rank
// (its random generator) into one folder that every rank must read back on
// a resume: without a folder all hosts share, a resume would fail steps
// later. Rank 0 leaves a marker there and every rank looks for it; a rank
// that does not see it stops the job now, naming the hosts.
void check_folder_shared(ControlGroup& control, const RunFolder& folder, int rank,
                         const std::vector<std::string>& hosts, const JobConfig& config) {
  const std::string nonce = control.exchange("shared-marker", rank == 0 ? random_hex(8) : "")[0];
  const std::string marker = folder.file(".shared-" + nonce);
  if (rank == 0) write_file_atomically(marker, nonce);
  control.barrier("shared-marker-written");
  const auto seen = control.exchange("shared-marker-seen", std::filesystem::exists(marker) ? "1" : "0");
  control.barrier("shared-marker-read");
  if (rank == 0) std::filesystem::remove(marker);
  std::string blind;
  for (size_t r = 0; r < seen.size(); ++r)
    if (seen[r] != "1") blind += (blind.empty() ? "" : ", ") + std::to_string(r) + " (" + hosts[r] + ")";
  if (!blind.empty())
    throw InputError("checkpoint.every = " + std::to_string(config.checkpoint.every) +
                     " needs a run folder that every host shares (a resume reads rank 0's model and "
                     "every rank's generator state from it), but rank(s) " + blind +
                     " do not see the marker file rank 0 (" + hosts[0] + ") wrote into " +
                     folder.path() + "; make job.run_dir a folder all hosts mount (NFS, ...), or "
                     "set checkpoint.every = 0");
}

// Everything rank 0 writes into manifest.json; filled in as the run goes.
struct Manifest {
  nlohmann::json body;
  const RunFolder* folder = nullptr;
  void write() const {
    if (folder) folder->write_manifest(body);
  }
};

}  // namespace

WorkerSummary run_worker(const JobConfig& config, Rendezvous& rendezvous, const ModelRegistry& registry,
                const WorkerOptions& options) {
  PhaseTimer timer;
  DecisionLog decisions;
  // Printed once for all ranks when training starts (the trainer exchanges
  // them); a rank that fails before then prints its own on the way out.
  decisions.hold();
  for (const auto& d : config.decisions) decisions.record(d.what, d.value, d.reason);
  warn_test_switches(config, decisions);

  // Input checks first: nothing is created until the input is known good.
  TrainTestData data = load_data(config.data, uint64_t(config.job.seed));
  spdlog::info("data: {}", data.description);
  // Also the settings that name parts of the model (fault.inject, ...), and an unknown model.name.
  // At the precision the job names; `auto` is known only on this host, below.
  const std::string named_precision = config.precision.dtype == "bf16" ? "bf16" : "fp32";
  std::string eval_precision;  // "": the training precision
  std::vector<Decision> model_decisions =
      check_model_on_data(config, registry, data, named_precision, &eval_precision);

  RendezvousResult place = rendezvous.join(to_ms(config.comm.rendezvous_timeout_s));
  const int rank = place.rank, world = place.world_size;
  if (world != config.job.world_size)
    throw InputError("the rendezvous says the world has " + std::to_string(world) +
                     " ranks (WORLD_SIZE) but job.world_size = " +
                     std::to_string(config.job.world_size) + "; make them agree");
  spdlog::info("rank {} of {} (local rank {} of {}); rendezvous: {}", rank, world,
               place.local_rank, place.local_world_size, place.description);
  if (world == 1) decisions.print_held(0, {decisions.held_json()});
  ResolvedMachine machine =
      resolve_machine(config, place.local_rank, place.local_world_size, options.cpu, decisions);
  if (machine.precision != named_precision && machine.precision == "bf16")  // auto chose bf16 here: the dry run at it too
    model_decisions = check_model_on_data(config, registry, data, machine.precision, &eval_precision);
  if (config.data.name == "images") {
    const int workers = config.data.workers > 0
                            ? int(config.data.workers)
                            : std::clamp(options.cpu.usable() / std::max(1, place.local_world_size), 1, 8);
    data.set_reader_threads(workers);
    decisions.record("data.workers", std::to_string(workers),
                     config.data.workers > 0
                         ? "data.workers: threads decoding images for each rank, batches assembled ahead"
                         : std::to_string(options.cpu.usable()) + " usable CPUs shared by " +
                               std::to_string(place.local_world_size) + " rank(s) on this host, at most "
                               "8; threads decoding images, batches assembled ahead (data.prefetch)");
  }
  const GlooAddressChoice gloo = choose_gloo_addresses(
      {config.comm.interface, options.gloo_socket_ifname, place.store_host, place.store_port});
  decisions.record("gloo_address", gloo.value, gloo.reason);
  if (place.store_port > 0) {
    // A lost peer (a cut link, a frozen process) closes nothing: a rank in
    // a collective with it would wait out comm.collective_timeout_s. When
    // the coordinator ends the generation, the connections to the peers
    // are shut down, so that the collective fails now and the rank unwinds.
    auto peers = std::make_shared<PeerConnections>(place.store_host, place.store_port);
    when_generation_ends([peers, rank] {
      const int shut = peers->shut_down();
      spdlog::warn("rank {}: the generation ended: shut down {} connection(s) to peers, so that a "
                   "collective waiting on a lost one fails now (kept the coordinator's)", rank, shut);
    });
  }

  auto control = std::make_unique<ControlGroup>(
      place.store,
      CollectiveGroup::gloo(prefixed("control/", place.store), rank, world,
                            to_ms(config.comm.barrier_timeout_s), gloo.addresses),
      to_ms(config.comm.barrier_timeout_s));
  // One kind of device and one backend for the whole job: a CPU rank's
  // bits differ from a GPU rank's, and a data group is on one backend.
  const c10::Device device(machine.device);
  const auto placements = control->exchange("device-backend", std::string(device.is_cuda() ? "cuda" : "cpu") +
                                                                  " " + machine.backend);
  for (int r = 1; r < world; ++r)
    if (placements[size_t(r)] != placements[0])
      throw InputError("rank " + std::to_string(r) + " trains with " + placements[size_t(r)] +
                       " (device, data group), rank 0 with " + placements[0] + ": every rank must "
                       "train on the same kind of device with the same backend; set device and "
                       "comm.backend in the job, or start at most one rank per GPU on every host");
  std::unique_ptr<CollectiveGroup> data_group;
  if (machine.backend == "nccl") {
    bool blocking_wait = false;
    data_group = CollectiveGroup::nccl(prefixed("data/", place.store), rank, world,
                                       to_ms(config.comm.collective_timeout_s), device.index(), &blocking_wait);
    decisions.record("nccl_wait", blocking_wait ? "blocking" : "asynchronous (TORCH_NCCL_BLOCKING_WAIT=0)",
                     blocking_wait ? "a collective not done within comm.collective_timeout_s throws on "
                                     "this rank, named, and the coordinator hears of it"
                                   : "the environment turned blocking waits off: NCCL's watchdog ends "
                                     "the process after comm.collective_timeout_s instead",
                     /*warn=*/!blocking_wait);
  } else {
    data_group = CollectiveGroup::gloo(prefixed("data/", place.store), rank, world,
                                       to_ms(config.comm.collective_timeout_s), gloo.addresses);
  }
  // Connected: from now on a store operation (the control group's barriers
  // and exchanges) that does not finish within the barrier's timeout fails
  // the step, naming the operation.
  place.store->setTimeout(to_ms(config.comm.barrier_timeout_s));
  decisions.record("process_groups", "data: " + machine.backend + ", control: gloo",
                   "gradients on the data group (timeout " +
                       fmt::format("{:g}", config.comm.collective_timeout_s) + " s); barriers and "
                       "checks on the control group (timeout " +
                       fmt::format("{:g}", config.comm.barrier_timeout_s) + " s)");

  // One run id and one folder for the whole job, chosen by rank 0.
  std::string proposed = place.run_id.empty() && rank == 0 ? new_run_id(config.job.name) : place.run_id;
  const std::string run_id = control->exchange("run-id", proposed)[0];
  const auto hosts = control->exchange("host", host_name() + " pid " + std::to_string(::getpid()));
  RunFolder folder(config.job.run_dir, run_id);
  Manifest manifest;
  // Every rank makes the folder on its own host: hosts need not share one.
  folder.create();
  if (rank == 0) {
    // Resuming in the same folder: the earlier manifest is kept, not
    // overwritten (a restarted generation continues the same one).
    if (!options.restarted && std::filesystem::exists(folder.file("manifest.json")))
      std::filesystem::rename(folder.file("manifest.json"),
                              folder.file("manifest-before-" + utc_timestamp() + ".json"));
    manifest.folder = &folder;
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < world; ++r) ranks.push_back({{"rank", r}, {"host", hosts[r]}});
    manifest.body = {{"run_id", run_id},
                     {"status", "running"},
                     {"started_at", utc_timestamp()},
                     {"lockstep_version", LOCKSTEP_VERSION},
                     {"libtorch_version", TORCH_VERSION},
                     {"job_file", config.job_file},
                     {"config", to_json(config)},
                     {"config_sources", config.sources},
                     {"settings", effective_settings(config)},
                     {"world_size", world},
                     {"generation", options.generation},
                     {"ranks", ranks},
                     {"rendezvous", place.description},
                     {"data", data.description},
                     {"data_files", data_provenance(data.files)}};
    for (const auto& [folder, files] : data.folders)
      manifest.body["data_files"].push_back(folder_provenance(folder, files));
    if (!data.classes.empty()) manifest.body["data_classes"] = data.classes;
    if (config.data.name == "images") {
      const size_t listed = std::min<size_t>(data.bad_files.size(), 100);
      manifest.body["bad_files"] = {
          {"policy", config.data.bad_files},
          {"skipped_before_training", data.bad_files.size()},
          {"files", std::vector<std::string>(data.bad_files.begin(), data.bad_files.begin() + long(listed))}};
    }
    manifest.write();
    spdlog::info("run folder: {}", folder.path());
  }
  control->barrier("run-folder");
  // An elastic job's new generation reads no checkpoint when its survivors
  // hold the state: its hosts need not share a folder for that.
  if (config.checkpoint.every > 0 || !config.checkpoint.resume.empty() || (options.restarted && !options.elastic))
    check_folder_shared(*control, folder, rank, hosts, config);
  EventWriter events(folder.file("events-rank" + std::to_string(rank) + ".jsonl"));
  // Each rank its own folder, so TensorBoard overlays the ranks; a restarted
  // generation adds a file beside the earlier one.
  TensorBoardWriter tensorboard(folder.file("tensorboard/rank" + std::to_string(rank)));
  events.mirror_to(&tensorboard);
  int64_t steps_done = 0;  // optimizer steps this rank finished, the resumed ones included

  // Each rank's host name (the exchange says "host pid N"): for the
  // messages that name a rank's machine.
  std::vector<std::string> host_names;
  for (const auto& h : hosts) host_names.push_back(h.substr(0, h.find(" pid ")));

  try {
    // The arithmetic probe: a rank whose processor computes a fixed
    // workload wrong is refused before it trains anything.
    nlohmann::json kernels = machine_fingerprint();
    kernels.erase("cores");
    kernels.erase("lockstep");
    if (!device.is_cuda()) kernels.erase("gpus");
    kernels["device"] = device.str();
    kernels["threads"] = machine.intra_op_threads;
    const ProbeResult probe = run_arithmetic_probe(device, config.test.probe_fault_rank == rank);
    check_arithmetic(*control, probe, kernels.dump(), hosts, decisions);
    events.write({{"event", "arithmetic_probe"}, {"seconds", probe.seconds},
                  {"kernel_digest", fmt::format("{:016x}", probe.kernel_digest)}, {"kernels", kernels}});
    // Seeding, first half: the same init on every rank, checked.
    seed_everything(uint64_t(config.job.seed));
    std::shared_ptr<Model> model = registry.build(config.model);
    if (device.is_cuda()) model->to(device);  // built on the CPU from the seed: the same init everywhere
    for (const auto& d : model_decisions) decisions.record(d.what, d.value, d.reason);
    const std::string init_digest = verify_identical_parameters(*control, *model, decisions);
    // Second half: every microbatch its own stream, seeded from (seed, step,
    // microbatch) before its forward; checked here on each rank's first
    // microbatch of step 0 (rank r of W starts at microbatch r * k / W).
    const int64_t first_microbatch = int64_t(rank) * config.train.accum_steps;  // k / W each
    const uint64_t train_seed = config.test.no_reseed ? uint64_t(config.job.seed)
                                                      : microbatch_seed(uint64_t(config.job.seed), 0, first_microbatch);
    seed_everything(train_seed);
    decisions.record("train_seed", config.test.no_reseed ? "job.seed" : "per microbatch",
                     config.test.no_reseed
                         ? "test.no_reseed: every microbatch draws the job's seed, the same stream"
                         : "every generator is seeded from (job.seed, step, microbatch index) before each "
                           "microbatch's forward: dropout and anything drawn from LibTorch's generator is "
                           "the same whichever rank computes the microbatch and whatever ran before it; "
                           "distinct streams checked on each rank's first microbatch",
                     /*warn=*/config.test.no_reseed);
    StreamCheck streams = check_streams_differ(*control, decisions);
    events.write({{"event", "seeding"},
                  {"init_param_digest", init_digest},
                  {"train_seed", train_seed},
                  {"dropout_mask_hash", TensorDigest{0, streams.probes[size_t(rank)], 0}.hex().substr(16)}});

    if (config.test.hold_rank == rank) {
      spdlog::warn("test.hold_rank: rank {} holds back {} s before the start barrier", rank,
                   config.test.hold_s);
      std::this_thread::sleep_for(to_ms(config.test.hold_s));
    }
    control->barrier("start");
    timer.add(Phase::kStartup, std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                             options.process_start).count());
    for (const auto& d : decisions.all())
      events.write({{"event", "decision"}, {"what", d.what}, {"value", d.value}, {"reason", d.reason}});

    int64_t parameter_count = 0;
    for (const auto& [name, p] : model->parameters()) parameter_count += p.numel();
    if (rank == 0) {
      nlohmann::json probes = nlohmann::json::array();
      for (uint64_t p : streams.probes) probes.push_back(TensorDigest{0, p, 0}.hex().substr(16));
      manifest.body["model"] = {{"name", config.model.name},
                                {"description", model->description()},
                                {"trainable_parameters", parameter_count},
                                {"parameters", parameter_count},
                                {"buffers", model->buffers().size()},
                                {"loss", config.loss.name}};
      manifest.body["seeds"] = {{"init", config.job.seed},
                                {"train_seed_rule", config.test.no_reseed ? "seed" : "per microbatch: (seed, step, microbatch)"}};
      manifest.body["checks"] = {{"arithmetic_probe", "agreed"},
                                 {"init_parameters_identical", true},
                                 {"init_param_digest", init_digest},
                                 {"random_streams_distinct", streams.all_distinct},
                                 {"dropout_mask_hashes", probes}};
      manifest.body["decisions"] = decisions.to_json();
      manifest.write();
    }

    EventWriter audit_evidence(folder.file("audit-rank" + std::to_string(rank) + ".jsonl"));
    // Each microbatch's gradient digest and each step's state, for
    // `lockstep verify` (exact summation: a microbatch's own gradient).
    std::optional<EventWriter> step_evidence_file_writer;
    std::optional<EvidenceRecorder> recorder;
    StepEvidence* evidence = options.replay;
    if (!evidence && config.comm.summation == "exact") {
      step_evidence_file_writer.emplace(folder.file(step_evidence_file(options.generation, rank)));
      recorder.emplace(*step_evidence_file_writer,
                       EvidenceRecorder::Where{rank, world, options.generation, host_names[size_t(rank)],
                                               machine.intra_op_threads});
      evidence = &*recorder;
    }
    AuditSection audit_options = config.audit;
    if (config.comm.buffers == "local" && audit_options.buffers == "check" && !model->buffers().empty()) {
      audit_options.buffers = "ignore";
      decisions.record("audit_buffers", "ignore",
                       "comm.buffers = local: each rank keeps its own buffers, so they are expected "
                       "to differ; the audit checks parameters only");
    }
    Auditor auditor(audit_options, *control, *model, audit_evidence);
    decisions.record("audit",
                     config.audit.every > 0
                         ? "every " + std::to_string(config.audit.every) + " steps, policy " +
                               config.audit.policy + ", buffers " + config.audit.buffers
                         : "off",
                     config.audit.every > 0
                         ? "digests of every parameter all-gathered on the control group, also "
                           "at the first and last step"
                         : "audit.every = 0: ranks that drift apart will go unnoticed",
                     config.audit.every == 0);
    std::optional<StateInMemory> from_memory;
    if (options.restarted && options.elastic && options.kept_state)
      from_memory = state_for_new_generation(*control, *options.kept_state, rank, decisions, events);
    std::optional<FoundCheckpoint> resume;
    if (!from_memory && (!config.checkpoint.resume.empty() || options.restarted))
      resume = choose_checkpoint_to_resume(
          config, config.checkpoint.resume.empty() ? folder.path() : config.checkpoint.resume,
          options.restarted && config.checkpoint.resume.empty(), world, *control, decisions,
          options.resume_at_most);
    if (options.observer) {
      options.observer->on_skipped_files(int64_t(data.bad_files.size()), 0);
      options.observer->on_phase("train");
    }
    TrainingResult result = train(TrainerParts{config, rank, world, model, data, *data_group,
                                               decisions, timer, events,
                                               options.terminal && rank == 0, options.observer,
                                               config.audit.every > 0 ? &auditor : nullptr,
                                               control.get(), folder.file("checkpoints"),
                                               resume ? &*resume : nullptr,
                                               from_memory ? &*from_memory : nullptr,
                                               options.elastic ? options.kept_state : nullptr, &steps_done,
                                               machine.precision,
                                               eval_precision.empty() ? machine.precision : eval_precision,
                                               evidence, host_names});
    if (result.stopped_at_step > 0 && options.observer && options.observer->regroup_requested()) {
      // An elastic job grows: every rank stopped after the same step and
      // keeps its state; the next generation goes on from there.
      events.write({{"event", "generation_end"}, {"step", result.stopped_at_step}, {"reason", "regroup"}});
      return WorkerSummary{{{"regroup", true}, {"stopped_at_step", result.stopped_at_step}}, decisions.to_json()};
    }
    if (options.observer) options.observer->on_phase("done");

    const bool stopped = result.stopped_at_step > 0;  // on request, to be resumed
    const std::string final_digest = combined_hex(model_digests(*model, true));
    if (!stopped) {
      auto scope = timer.measure(Phase::kCheckpoint);
      if (rank == 0) {
        // Serialised in memory, then written atomically: a full disk leaves
        // no 0-byte or half model-final.pt, and the error names the file.
        write_file_atomically(folder.file("model-final.pt"), model->saved_bytes());
      }
    }
    control->barrier("end");
    int64_t skipped_in_batches = 0;  // over all ranks: each decodes its own shard
    for (const auto& count : control->exchange("skipped-in-batches", std::to_string(data.unreadable_in_batches())))
      skipped_in_batches += std::stoll(count);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                      options.process_start).count();
    nlohmann::json metrics = result.to_json();
    metrics["final_param_digest"] = final_digest;
    NamedDigests buffer_digests;  // per rank: whether comm.buffers kept them equal
    for (const auto& [name, tensor] : model->buffers()) buffer_digests.emplace_back(name, digest(tensor));
    metrics["final_buffer_digest"] = combined_hex(buffer_digests);
    events.write({{"event", "end"}, {"metrics", metrics}, {"phases", timer.to_json(wall)},
                  {"final_param_digest", final_digest}, {"peak_rss_mb", peak_rss_mb()}});
    if (rank == 0) {
      manifest.body["metrics"] = metrics;
      manifest.body["metrics"]["wall_s"] = wall;
      if (manifest.body.contains("bad_files")) manifest.body["bad_files"]["skipped_in_batches"] = skipped_in_batches;
      manifest.body["phases"] = timer.to_json(wall);
      manifest.body["decisions"] = decisions.to_json();
    }
    // The same figures on every rank (summed with the gradients): all fail
    // alike, and the manifest keeps the metrics that show it.
    if (!stopped && result.steps > 0 && result.samples == 0)
      throw RunError("no step trained: none of the " + std::to_string(result.steps) +
                     " optimizer steps had a valid target in its global batch (every target missing: "
                     "-1 or NaN); the model is as it was initialised. Check the targets of " + config.data.name +
                     " (data.train)");
    if (rank == 0) {
      manifest.body["status"] = stopped ? "stopped" : "completed";
      manifest.body["finished_at"] = utc_timestamp();
      manifest.write();
      if (stopped) {
        spdlog::info("run folder: {}", folder.path());
        return WorkerSummary{metrics, decisions.to_json()};
      }
      spdlog::info("{} after {} steps ({} masked targets on rank 0, {} skipped steps)",
                   result.eval_summary, result.steps, result.masked_targets, result.skipped_steps);
      spdlog::info("time by phase on rank 0:\n{}", timer.table(wall));
      // Only evaluations during training can be made rarer: with the final
      // one alone, raising eval.every would change nothing.
      const bool evaluated_during_training = config.eval.every > 0 && config.eval.every < result.steps;
      if (timer.seconds(Phase::kEval) > timer.train_seconds() && evaluated_during_training)
        spdlog::warn("evaluation took longer than training ({:.1f} s vs {:.1f} s): raise "
                     "eval.every (now {}) or lower the test-set cost",
                     timer.seconds(Phase::kEval), timer.train_seconds(), config.eval.every);
      else if (timer.seconds(Phase::kEval) > timer.train_seconds())
        spdlog::info("the final evaluation took longer than training ({:.1f} s vs {:.1f} s): a short run "
                     "against the whole test set", timer.seconds(Phase::kEval), timer.train_seconds());
      spdlog::info("run folder: {}", folder.path());
    }
    return WorkerSummary{metrics, decisions.to_json()};
  } catch (const std::exception& e) {
    // Recording the failure may fail too (the disk that was full is still
    // full): that is said, and the original error is the one that leaves.
    try {
      // The whole message (a TorchScript traceback) goes to this rank's
      // file; the log, the manifest and the coordinator get its one line.
      nlohmann::json failed = {{"event", "failed"}, {"error", e.what()}, {"steps_done", steps_done},
                               {"generation", options.generation}};
      if (const auto* model_failure = dynamic_cast<const ModelFailure*>(&e)) {
        const std::string file = folder.file("failure-rank" + std::to_string(rank) + ".log");
        write_file_atomically(file, std::string(e.what()) + "\n\n" + model_failure->detail() + "\n");
        failed["detail_file"] = file;
      }
      if (rank == 0) {
        manifest.body["status"] = "failed";
        manifest.body["error"] = e.what();
        if (failed.contains("detail_file")) manifest.body["error_detail_file"] = failed["detail_file"];
        manifest.body["finished_at"] = utc_timestamp();
        manifest.body["decisions"] = decisions.to_json();
        manifest.write();
      }
      events.write(failed);
    } catch (const std::exception& recording) {
      spdlog::error("could not record the failure in the run folder: {}", recording.what());
    }
    throw;
  }
}

}  // namespace lockstep

#pragma once
// The job configuration: one TOML file plus `--set key=value` overrides,
// parsed once into plain structs. Every key has a type, a default and an
// allowed range; an unknown key, a wrong type or a value out of range is an
// InputError naming the key and what is allowed. Nothing below this file
// reads the TOML tree or the environment.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace lockstep {

struct JobSection {
  std::string name = "lockstep";  // used in the run id
  int64_t world_size = 1;         // ranks in the job
  int64_t seed = 0;               // shared init seed; rank r trains with seed + r
  int64_t steps = 0;              // optimizer steps (exactly one of steps/epochs)
  double epochs = 0;              // passes over the training set
  std::string run_dir = "./runs"; // where runs/<run-id>/ is written
  int64_t log_every = 50;         // steps between logged events
  // Intra-op (and BLAS) threads of each rank; 0 = derived from the CPUs this
  // process may use (affinity, cgroup quota, OMP_NUM_THREADS) over its
  // local ranks. Set it for the same bits however the ranks are placed.
  int64_t threads_per_rank = 0;
};

struct ModelSection {
  std::string name = "cnn";  // a name in the model registry, or torchscript
  double dropout = 0.25;     // dropout before the last layer (cnn)
  std::string path;          // torchscript: the module saved from Python
  std::string output;        // torchscript: the tuple index or dict key of the output to train on
};

// What the trainer minimises: the mean over every target of the global
// batch (all ranks, all microbatches), missing targets left out.
struct LossSection {
  // cross_entropy (class targets, -1 missing) | mse | l1 (float targets, NaN
  // missing, element-wise) | bce_with_logits (multi-label, NaN missing) |
  // model (the TorchScript module's own loss(output, target), per sample)
  std::string name = "cross_entropy";
  double label_smoothing = 0.0;  // cross_entropy only
};

struct DataSection {
  std::string name = "fashion-mnist";  // fashion-mnist | synthetic | arrays | images
  std::string path = "/usr/share/datasets/fashion-mnist";
  std::string train;                     // arrays: an .npz, or a folder holding x.npy and y.npy;
                                         // images: a folder with one sub-folder of images per class
  std::string test;                      // arrays, images: the same for the test set
  // Held out from training and evaluated every eval.every steps (the test
  // set at the end): "" = none, a fraction ("0.1": a split seeded by
  // job.seed), or an .npz / folder like data.test (arrays).
  std::string validation;
  // Augmentation of training batches on each rank's own random stream:
  // "random_crop:4, hflip" (or a TOML array); "" = none.
  std::string augment;
  std::string inputs_key = "x";          // arrays: the inputs' name in the .npz / folder
  std::string targets_key = "y";         // arrays: the targets' name
  double scale = 1.0;                    // arrays, images: inputs are multiplied by it (images: 1/255
                                         // unless set)
  std::string mean;                      // arrays, images: per-channel means subtracted after scaling
  std::string std;                       // arrays, images: per-channel standard deviations divided by
  // images: "" = the first training image's size, "32" = 32 x 32, "64,48" = 64 high, 48 wide;
  // every image is resized to it (bilinear, antialiased when shrinking).
  std::string image_size;
  int64_t channels = 0;                  // images: 1 (grey) or 3 (RGB); 0 = as the first training image
  int64_t workers = 0;                   // images: decoding threads per rank; 0 = from the cores
  std::string bad_files = "error";       // images: error | skip (a file that does not decode)
  int64_t batch_size = 64;               // per rank, per microbatch (data.microbatch when that is set)
  // The work of one optimizer step, whatever the world size: global_batch
  // samples cut into global_batch / microbatch microbatches in a fixed
  // order, rank r of W computing a contiguous block of k / W of them. 0 =
  // derived from the per-rank keys (batch_size x accum_steps x world_size,
  // batch_size); resolved at load (resolve_global_batch), so after it both
  // are set and batch_size, train.accum_steps follow from them.
  int64_t global_batch = 0;
  int64_t microbatch = 0;
  int64_t synthetic_samples = 4096;      // training samples of the synthetic set
  double missing_targets = 0.0;          // synthetic: share of labels set to -1
  int64_t prefetch = 4;                  // batches assembled ahead by a background thread
};

struct OptimSection {
  std::string name = "sgd";  // sgd | adamw | adam | rmsprop
  double lr = 0.05;
  double momentum = 0.9;       // sgd, rmsprop
  bool nesterov = false;       // sgd with momentum > 0
  double weight_decay = 0.0;   // adamw: decoupled; the others: added to the gradient
  double beta1 = 0.9;          // adam, adamw
  double beta2 = 0.999;        // adam, adamw
  double eps = 1e-8;           // adam, adamw, rmsprop
  double alpha = 0.99;         // rmsprop: smoothing of the squared gradient
  double clip_norm = 0.0;      // global-norm clipping; 0 = off
  int64_t warmup_steps = 0;    // linear warmup from 0 to lr
  std::string schedule = "constant";  // constant | cosine
};

struct TrainSection {
  int64_t accum_steps = 1;  // microbatches per optimizer step
};

struct EvalSection {
  int64_t every = 0;         // steps between evaluations; 0 = only at the end
  int64_t batch_size = 1000;
};

struct CommSection {
  std::string backend = "auto";        // auto | gloo | nccl (data group)
  double bucket_mb = 25.0;             // gradient bytes per all-reduce
  bool overlap = true;                 // start a bucket's all-reduce during backward (summation = float)
  // The gradient sum over microbatches and ranks: exact (64-bit integers on
  // one grid per bucket: the same bits on any world size) | float (LibTorch's
  // float sums in the all-reduce's order: bits depend on the world size)
  std::string summation = "exact";
  std::string unused_parameters = "error";  // a parameter without a gradient: error | zero
  // Buffers (BatchNorm running statistics, ...): broadcast (rank 0's to all,
  // as PyTorch DDP does) | average (floating ones averaged after each step)
  // | local (each rank keeps its own)
  std::string buffers = "auto";
  double barrier_timeout_s = 60.0;     // control group: barriers, checks
  double collective_timeout_s = 300.0; // data group: gradient all-reduce
  double rendezvous_timeout_s = 120.0; // reaching the coordinator and the store, connecting the groups
  // The interface (eth0) or local address Gloo binds; "" = the one on the
  // route to the rendezvous store. GLOO_SOCKET_IFNAME on a host wins.
  std::string interface;
};

struct AuditSection {
  int64_t every = 10;             // steps between audits (also the first and last step); 0 = off
  std::string policy = "warn";    // on a mismatch: warn | fail | resync
  std::string buffers = "check";  // buffers: check (like parameters) | sync (from rank 0) | ignore
  // Steps between cross-checks: each rank recomputes a microbatch another
  // rank computed in that step and compares the digests of its gradient
  // and loss (0 = off). 100: about 1 / (100 x microbatches per rank) more
  // compute, measured by tests/bench/verify_cost.py.
  int64_t verify_every = 100;
  std::string on_miscompute = "fail";  // a cross-check that differs: warn | fail | exclude (the owner's host)
};

struct CheckpointSection {
  int64_t every = 0;  // steps between checkpoints (and one at the end); 0 = none
  int64_t keep = 2;   // complete checkpoints kept; older ones go once a newer is complete
  std::string resume; // a run folder to continue from its newest valid checkpoint (--resume)
};

// The elastic range: a job that loses ranks goes on with fewer (the
// largest world size that divides the step's microbatches), from the step
// where it stopped, on the bits of the run that lost nothing; a worker that
// joins later brings it back up.
struct ElasticSection {
  int64_t min_ranks = 0;        // the fewest ranks the job goes on with; 0 = job.world_size (never fewer)
  int64_t max_ranks = 0;        // 0 = job.world_size; set, it is the world size (--nproc must agree)
  double replace_wait_s = 5.0;  // after a loss, how long a replacement may take before the job shrinks
  int64_t max_host_losses = 3;  // a host lost this often is kept out of the job
};

struct FaultSection {
  double heartbeat_s = 1.0;           // worker -> coordinator heartbeat period
  double heartbeat_timeout_s = 10.0;  // silence after which either side gives up on the other
  int64_t max_restarts = 3;           // new generations after a worker is lost (0: the first loss fails the job)
  // Injected faults, to see the alarms work; "" = none. Items separated by ';':
  //   perturb:TENSOR:RANK:STEP:AMOUNT   add AMOUNT to element 0 of TENSOR on RANK after STEP
  //   double_scale:TENSOR:RANK:STEP     at STEP, a per-tensor gradient scale (x0.5) on every
  //                                     rank, where on RANK two entries alias TENSOR's gradient
  //   inf_grad:TENSOR:RANK:STEP         element 0 of TENSOR's gradient becomes inf on RANK in
  //                                     STEP, before the all-reduce (the scaler must skip it)
  std::string inject;
};

// One parsed item of fault.inject.
struct InjectedFault {
  std::string kind;    // perturb | double_scale | inf_grad | bitflip_grad
  std::string tensor;  // a parameter name, e.g. fc2.bias
  int64_t rank = 0;
  int64_t step = 0;    // 1-based optimizer step
  double amount = 0;   // perturb only
};

// "fc, head" -> {"fc", "head"}: a comma-separated list of names, trimmed.
std::vector<std::string> split_names(const std::string& text);

// Parses fault.inject. Throws InputError naming the item and the format.
std::vector<InjectedFault> parse_injected_faults(const std::string& text);

// Mixed precision: decided per machine (runtime/precision/machine.h), said out loud.
struct PrecisionSection {
  std::string dtype = "auto";   // auto | fp32 | bf16 | fp16 (`precision = "bf16"` sets it too)
  bool allow_emulated = false;  // run bf16/fp16 where the machine only emulates it (warned)
  // Submodules (children of the model, by name) that run with autocast off,
  // their inputs cast to fp32 first: "head" or "fc,head" (or a TOML array).
  std::string fp32_modules;
  std::string scaler = "auto";  // auto (on for fp16) | on | off: the gradient scaler
  double init_scale = 0;        // 0 = chosen from the run length (logged)
  int64_t growth_interval = 0;  // good steps before the scale doubles; 0 = chosen (logged)
  double max_skipped_share = 0.05;  // more skipped steps than this share: a loud warning
  bool check_overflow = false;  // name the first module whose output holds inf/NaN
};

// Switches that exist so tests can make the checks fail. Never needed in a
// real job; each one that is set is logged as a warning.
struct TestSection {
  bool no_reseed = false;       // every microbatch seeded with job.seed (the streams then repeat)
  int64_t hold_rank = -1;       // this rank sleeps hold_s before the start barrier
  double hold_s = 0.0;
  int64_t fail_rank = -1;       // this rank fails at fail_step ...
  int64_t fail_step = -1;
  std::string fail_kind = "exit";  // ... by exiting (status 3) | kill (SIGKILL) | nan_loss
  int64_t fail_generations = 1;    // ... in this many generations of a restarted run
  int64_t probe_fault_rank = -1;   // this rank's arithmetic probe gets one bit wrong
};

// A choice made while reading the configuration (the command line's
// job.steps replacing the file's job.epochs), for the decision log.
struct ConfigDecision {
  std::string what, value, reason;
};

struct JobConfig {
  JobSection job;
  ModelSection model;
  LossSection loss;
  DataSection data;
  OptimSection optim;
  TrainSection train;
  EvalSection eval;
  CommSection comm;
  AuditSection audit;
  CheckpointSection checkpoint;
  FaultSection fault;
  ElasticSection elastic;
  TestSection test;
  PrecisionSection precision;
  std::string device = "auto";     // auto | cpu | gpu

  // Where each key's value came from: "default", the job file, or "--set".
  std::map<std::string, std::string> sources;
  std::string job_file;  // path it was read from ("" when built in code)
  std::vector<ConfigDecision> decisions;  // made while reading it
};

// Reads `path`, applies `overrides` ("key=value", later wins) and validates.
// Throws InputError naming the file, key and allowed values.
JobConfig load_job_config(const std::string& path, const std::vector<std::string>& overrides);

// Applies overrides to an existing config (used by tests and by load).
void apply_overrides(JobConfig& config, const std::vector<std::string>& overrides);

// Cross-key checks (steps xor epochs, ...). Throws InputError.
void validate(const JobConfig& config);
// data.global_batch and data.microbatch from the per-rank keys (recorded as
// a decision), or the per-rank keys from them; InputError for a world size
// that does not divide the microbatches of a step (naming the ones that
// do), a global batch that is not a multiple of the microbatch, and per-rank
// keys that contradict them.
void resolve_global_batch(JobConfig& config);
// The decisions of a resolved global batch (where it came from, each
// rank's microbatches), for a rank that received the resolved settings.
void describe_global_batch(JobConfig& config);
// k: the microbatches of one step over all ranks (data.global_batch /
// data.microbatch, as resolve_global_batch left them).
int64_t microbatches_per_step(const JobConfig& config);

// A number as the job's messages print it: six significant digits ("0.001", "1e+06").
std::string format_number(double x);

// Every key as "key=value", such that apply_overrides on a default
// JobConfig rebuilds this one (how the coordinator ships the job).
std::vector<std::string> effective_settings(const JobConfig& config);

// Every key with its value, as written into manifest.json.
nlohmann::json to_json(const JobConfig& config);

// All known keys, for error messages and documentation.
std::vector<std::string> known_keys();

// The configuration as a job file: one table per section, every key with
// its value, and where the value came from in a comment. Read back, it
// gives the same configuration.
std::string effective_toml(const JobConfig& config);

// Every key: {"key", "type", "default", "allowed"}, for `lockstep keys`.
nlohmann::json describe_keys();

}  // namespace lockstep

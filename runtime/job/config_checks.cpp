// The job's cross-key checks (validate) and the parsers of list-valued keys
// (data.mean, data.image_size, fault.inject), apart from the key schema in
// config.cpp. Every refusal is an InputError naming the key and what is allowed.
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "runtime/job/config.h"
#include "runtime/base/errors.h"

namespace lockstep {

void validate(const JobConfig& config) {
  const auto& job = config.job;
  if ((job.steps > 0) == (job.epochs > 0))
    throw InputError("set exactly one of job.steps and job.epochs (now job.steps = " +
                     std::to_string(job.steps) + ", job.epochs = " + format_number(job.epochs) +
                     ")");
  auto rank_key = [&](const char* key, int64_t rank) {
    if (rank >= job.world_size)
      throw InputError("key '" + std::string(key) + "' = " + std::to_string(rank) +
                       " names no rank: job.world_size is " + std::to_string(job.world_size) +
                       " (allowed: -1 or 0.." + std::to_string(job.world_size - 1) + ")");
  };
  rank_key("test.hold_rank", config.test.hold_rank);
  rank_key("test.fail_rank", config.test.fail_rank);
  rank_key("test.probe_fault_rank", config.test.probe_fault_rank);
  for (const auto& fault : parse_injected_faults(config.fault.inject))
    rank_key("fault.inject", fault.rank);
  // Excluding a host that computed wrong is a shrink: an elastic range must allow one.
  if (config.audit.on_miscompute == "exclude" && config.audit.verify_every > 0 &&
      (config.elastic.min_ranks <= 0 || config.elastic.min_ranks >= job.world_size))
    throw InputError("audit.on_miscompute = exclude drops the host of a rank that computed wrong and goes on "
                     "with fewer ranks: set elastic.min_ranks below job.world_size = " +
                     std::to_string(job.world_size) + " (now " + std::to_string(config.elastic.min_ranks) +
                     "), or choose audit.on_miscompute = fail or warn");
  // Periods and timeouts shorter than a millisecond (0.001 s) are refused by
  // their ranges above: they would round to 0 ms, which c10d reads as "no
  // timeout", or spin a loop.
  if (config.fault.heartbeat_timeout_s <= config.fault.heartbeat_s)
    throw InputError("fault.heartbeat_timeout_s = " + format_number(config.fault.heartbeat_timeout_s) +
                     " must be above fault.heartbeat_s = " + format_number(config.fault.heartbeat_s) +
                     ": otherwise every healthy rank is declared dead between two heartbeats "
                     "(a few heartbeats, e.g. 10 x fault.heartbeat_s, is usual)");
  if (job.name.empty() || job.name.size() > 100 ||
      job.name.find_first_of("/\\") != std::string::npos || job.name == "." || job.name == "..")
    throw InputError("job.name '" + job.name.substr(0, 120) + (job.name.size() > 120 ? "…" : "") +
                     "': it names the run's folder, so 1 to 100 characters without '/' (now " +
                     std::to_string(job.name.size()) + ")");
  if (config.optim.nesterov && (config.optim.name != "sgd" || config.optim.momentum <= 0))
    throw InputError("optim.nesterov = true needs optim.name = sgd with optim.momentum > 0 (now " +
                     config.optim.name + ", momentum " + format_number(config.optim.momentum) + ")");
  if (config.loss.label_smoothing > 0 && config.loss.name != "cross_entropy")
    throw InputError("key 'loss.label_smoothing' applies to loss.name = cross_entropy only (now " +
                     config.loss.name + ")");
  if (config.model.name != "torchscript" && (!config.model.path.empty() || !config.model.output.empty()))
    throw InputError("keys 'model.path' and 'model.output' apply to model.name = torchscript only "
                     "(now " + config.model.name + ")");
  if (config.model.name == "torchscript" && config.model.path.empty())
    throw InputError("model.name = torchscript needs model.path: a module saved from Python with "
                     "torch.jit.script(model).save(\"net.pt\") (tools/lockstep_model.py does it)");
  if (config.loss.name == "model" && config.model.name != "torchscript")
    throw InputError("loss.name = model uses the TorchScript module's own loss(output, target) "
                     "method, so it needs model.name = torchscript (now " + config.model.name + ")");
  const bool from_files = config.data.name == "arrays" || config.data.name == "images";
  if (config.data.name == "arrays" && (config.data.train.empty() || config.data.test.empty()))
    throw InputError("data.name = arrays needs data.train and data.test: .npz files written by "
                     "numpy.savez (arrays x and y), or folders holding x.npy (inputs) and y.npy (targets)");
  if (config.data.name == "images" && (config.data.train.empty() || config.data.test.empty()))
    throw InputError("data.name = images needs data.train and data.test: folders holding one "
                     "sub-folder of .png / .jpg images per class (train/cat/1.png, train/dog/2.jpg, ...)");
  if (!from_files && (config.data.scale != 1.0 || !config.data.mean.empty() || !config.data.std.empty()))
    throw InputError("keys 'data.scale', 'data.mean' and 'data.std' apply to data.name = arrays or "
                     "images only (now " + config.data.name + ")");
  if (config.data.name != "images" &&
      (!config.data.image_size.empty() || config.data.channels != 0 || config.data.workers != 0 ||
       config.data.bad_files != "error"))
    throw InputError("keys 'data.image_size', 'data.channels', 'data.workers' and 'data.bad_files' "
                     "apply to data.name = images only (now " + config.data.name + ")");
  if (config.data.channels == 2)
    throw InputError("key 'data.channels' = 2: allowed are 1 (grey), 3 (RGB) or 0 (as the first "
                     "training image)");
  if (!config.data.image_size.empty()) {
    const auto parts = split_names(config.data.image_size);
    bool good = parts.size() == 1 || parts.size() == 2;
    for (const auto& part : parts) {
      size_t used = 0;
      long value = 0;
      try {
        value = std::stol(part, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      good = good && used == part.size() && value >= 1 && value <= 16384;
    }
    if (!good)
      throw InputError("key 'data.image_size' = '" + config.data.image_size + "': one size (\"32\": "
                       "32 x 32) or height and width (\"64,48\"), each 1 to 16384 pixels");
  }
  for (const char* key : {"data.mean", "data.std"}) {
    const std::string& text = std::string(key) == "data.mean" ? config.data.mean : config.data.std;
    for (const auto& item : split_names(text)) {
      size_t used = 0;
      double value = 0;
      try {
        value = std::stod(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != item.size() || !std::isfinite(value) || (std::string(key) == "data.std" && value <= 0))
        throw InputError("key '" + std::string(key) + "' = '" + text + "': '" + item + "' is not " +
                         (std::string(key) == "data.std" ? "a number above 0" : "a number") +
                         " (a comma-separated list, one per channel, or one for all)");
    }
  }
  if (split_names(config.data.mean).size() != split_names(config.data.std).size() &&
      !config.data.std.empty() && !config.data.mean.empty())
    throw InputError("data.mean has " + std::to_string(split_names(config.data.mean).size()) +
                     " values and data.std " + std::to_string(split_names(config.data.std).size()) +
                     "; give one per channel for both");
  if (!from_files && (!config.data.train.empty() || !config.data.test.empty()))
    throw InputError("keys 'data.train' and 'data.test' apply to data.name = arrays or images only (now " +
                     config.data.name + ")");
  if (config.data.name != "synthetic" && config.data.missing_targets > 0)
    throw InputError("key 'data.missing_targets' applies to data.name = synthetic only (now " +
                     config.data.name + ")");
}

void resolve_global_batch(JobConfig& config) {
  DataSection& data = config.data;
  // Printed by the ranks, once, with their own decisions.
  auto record = [&](const std::string& what, const std::string& value, const std::string& reason) {
    config.decisions.push_back(ConfigDecision{what, value, reason});
  };
  // elastic.max_ranks is the world size: it sets one left at its default,
  // and must agree with one set (the job file, --set, --nproc).
  ElasticSection& elastic = config.elastic;
  if (elastic.max_ranks > 0 && elastic.max_ranks != config.job.world_size) {
    if (config.sources["job.world_size"] != "default")
      throw InputError("elastic.max_ranks = " + std::to_string(elastic.max_ranks) + " but job.world_size = " +
                       std::to_string(config.job.world_size) + " (from " + config.sources["job.world_size"] +
                       "): the world size is the elastic range's maximum; make them agree, or leave one out");
    config.job.world_size = elastic.max_ranks;
    config.sources["job.world_size"] = "elastic.max_ranks";
    record("job.world_size", std::to_string(elastic.max_ranks), "from elastic.max_ranks: the most ranks the job trains on");
  }
  const int64_t world = config.job.world_size;
  if (elastic.min_ranks > world)
    throw InputError("elastic.min_ranks = " + std::to_string(elastic.min_ranks) + " is above the world size " +
                     std::to_string(world) + " (job.world_size, elastic.max_ranks or --nproc): the range is "
                     "min_ranks..world size");
  // The command line (a user's --set, or a resume's stored settings) that
  // sets data.global_batch replaces the job file's per-rank keys, as
  // job.steps replaces job.epochs.
  if (data.global_batch > 0 && config.sources["data.global_batch"] == "--set")
    for (const char* key : {"data.batch_size", "train.accum_steps"}) {
      const std::string source = config.sources[key];
      if (source == "default" || source == "--set") continue;
      record("per_rank_batch_replaced", key,
             "--set data.global_batch = " + std::to_string(data.global_batch) + " replaces " + key +
                 " from " + source + " (the world size divides the global batch)");
      config.sources[key] = "default";
    }
  auto set_by_user = [&](const char* key) { return config.sources[key] != "default"; };
  if (data.global_batch == 0 && data.microbatch == 0) {  // the per-rank keys, as before
    data.microbatch = data.batch_size;
    data.global_batch = data.batch_size * config.train.accum_steps * world;
  }
  if (data.microbatch == 0) data.microbatch = data.batch_size;
  if (data.global_batch == 0)
    throw InputError("data.microbatch = " + std::to_string(data.microbatch) + " needs data.global_batch: the "
                     "samples of one optimizer step over all ranks (a multiple of data.microbatch)");
  if (set_by_user("data.batch_size") && data.batch_size != data.microbatch)
    throw InputError("data.batch_size = " + std::to_string(data.batch_size) + " and data.microbatch = " +
                     std::to_string(data.microbatch) + " disagree: with data.global_batch set, leave "
                     "data.batch_size out (data.microbatch is the batch of one forward)");
  if (data.global_batch % data.microbatch != 0)
    throw InputError("data.global_batch = " + std::to_string(data.global_batch) + " is not a multiple of "
                     "data.microbatch = " + std::to_string(data.microbatch) + "; make it one (for example " +
                     std::to_string((data.global_batch / data.microbatch + 1) * data.microbatch) + ")");
  const int64_t k = data.global_batch / data.microbatch;
  if (k % world != 0) {
    std::string working;
    for (int64_t w = 1; w <= k && working.size() < 200; ++w)
      if (k % w == 0) working += (working.empty() ? "" : ", ") + std::to_string(w);
    throw InputError("job.world_size = " + std::to_string(world) + " does not divide the " + std::to_string(k) +
                     " microbatches of a step (data.global_batch = " + std::to_string(data.global_batch) +
                     " / data.microbatch = " + std::to_string(data.microbatch) + "); world sizes that do: " +
                     working);
  }
  if (set_by_user("train.accum_steps") && config.train.accum_steps != k / world)
    throw InputError("train.accum_steps = " + std::to_string(config.train.accum_steps) + ", but data.global_batch = " +
                     std::to_string(data.global_batch) + " on " + std::to_string(world) + " rank(s) of data.microbatch = " +
                     std::to_string(data.microbatch) + " means " + std::to_string(k / world) +
                     " microbatches per rank; leave train.accum_steps out");
  data.batch_size = data.microbatch;
  config.train.accum_steps = k / world;
  describe_global_batch(config);
  if (elastic.min_ranks > 0 && elastic.min_ranks < world) {
    std::string sizes;
    for (int64_t w = world; w >= elastic.min_ranks; --w)
      if (k % w == 0) sizes += (sizes.empty() ? "" : ", ") + std::to_string(w);
    if (sizes == std::to_string(world))
      throw InputError("elastic.min_ranks = " + std::to_string(elastic.min_ranks) + ": no world size from " +
                       std::to_string(elastic.min_ranks) + " to " + std::to_string(world - 1) + " divides the " +
                       std::to_string(k) + " microbatches of a step, so the job could never go on with fewer; "
                       "lower elastic.min_ranks or choose data.global_batch / data.microbatch with more divisors");
    record("elastic", std::to_string(elastic.min_ranks) + ".." + std::to_string(world) + " ranks",
           "after a loss with no replacement within elastic.replace_wait_s = " + format_number(elastic.replace_wait_s) +
               " s the job goes on with the largest of " + sizes + " (the world sizes in the range that divide the " +
               std::to_string(k) + " microbatches of a step) that the workers left fill, from the step it stopped "
               "at, and grows back when workers join; the global batch and the bits stay those of the full run");
  }
}

int64_t microbatches_per_step(const JobConfig& config) {
  return config.data.global_batch / std::max<int64_t>(1, config.data.microbatch);
}

void describe_global_batch(JobConfig& config) {
  const DataSection& data = config.data;
  const int64_t world = config.job.world_size, k = microbatches_per_step(config);
  auto record = [&](const std::string& what, const std::string& value, const std::string& reason) {
    config.decisions.push_back(ConfigDecision{what, value, reason});
  };
  if (config.sources["data.global_batch"] == "default")  // derived from the per-rank keys
    record("data.global_batch", std::to_string(data.global_batch),
           "from data.batch_size = " + std::to_string(data.microbatch) + " per rank x train.accum_steps = " +
               std::to_string(k / std::max<int64_t>(1, world)) + " x job.world_size = " + std::to_string(world) +
               "; data.microbatch = " + std::to_string(data.microbatch) +
               ": set data.global_batch and data.microbatch to fix the work of a step for any world size");
  record("microbatches_per_rank", std::to_string(k / std::max<int64_t>(1, world)),
         "data.global_batch = " + std::to_string(data.global_batch) + " in " + std::to_string(k) +
             " microbatches of " + std::to_string(data.microbatch) + "; rank r of " + std::to_string(world) +
             " computes microbatches " + (world == 1 ? std::string("0.." + std::to_string(k - 1))
                                                     : "r*" + std::to_string(k / world) + " to r*" +
                                                           std::to_string(k / world) + "+" + std::to_string(k / world - 1)));
}

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> names;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    const auto first = item.find_first_not_of(' '), last = item.find_last_not_of(' ');
    if (first != std::string::npos) names.push_back(item.substr(first, last - first + 1));
  }
  return names;
}

std::vector<InjectedFault> parse_injected_faults(const std::string& text) {
  std::vector<InjectedFault> faults;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ';')) {
    if (item.find_first_not_of(' ') == std::string::npos) continue;
    std::vector<std::string> parts;
    std::stringstream fields(item);
    for (std::string field; std::getline(fields, field, ':');) parts.push_back(field);
    auto bad = [&](const std::string& why) {
      return InputError("fault.inject item '" + item + "': " + why +
                        " (formats: perturb:TENSOR:RANK:STEP:AMOUNT, double_scale:TENSOR:RANK:STEP, "
                        "inf_grad:TENSOR:RANK:STEP, bitflip_grad:TENSOR:RANK:STEP)");
    };
    InjectedFault fault;
    fault.kind = parts.empty() ? "" : parts[0];
    const size_t expected = fault.kind == "perturb"                                 ? 5
                            : fault.kind == "double_scale" || fault.kind == "inf_grad" ||
                                      fault.kind == "bitflip_grad"
                                ? 4
                                : 0;
    if (expected == 0) throw bad("unknown kind '" + fault.kind + "'");
    if (parts.size() != expected) throw bad("expected " + std::to_string(expected) + " fields");
    fault.tensor = parts[1];
    try {
      size_t used = 0;
      fault.rank = std::stoll(parts[2], &used);
      if (used != parts[2].size() || fault.rank < 0) throw bad("RANK must be an integer >= 0");
      fault.step = std::stoll(parts[3], &used);
      if (used != parts[3].size() || fault.step < 1) throw bad("STEP must be an integer >= 1");
      if (expected == 5) {
        fault.amount = std::stod(parts[4], &used);
        // inf is allowed: it plants an overflow for precision.check_overflow to find.
        if (used != parts[4].size() || std::isnan(fault.amount)) throw bad("AMOUNT must be a number");
      }
    } catch (const std::logic_error&) {
      throw bad("RANK and STEP must be integers, AMOUNT a number");
    }
    if (fault.tensor.empty()) throw bad("TENSOR is empty");
    faults.push_back(fault);
  }
  return faults;
}

}  // namespace lockstep

#include "runtime/job/keys.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "lockstep/build_config.h"

namespace lockstep {
namespace {

void assign(int64_t& field, const Value& v) { field = std::get<int64_t>(v); }
void assign(double& field, const Value& v) { field = std::get<double>(v); }
void assign(bool& field, const Value& v) { field = std::get<bool>(v); }
void assign(std::string& field, const Value& v) { field = std::get<std::string>(v); }

}  // namespace

#define LOCKSTEP_FIELD(MEMBER)                                     \
  [](JobConfig& c, const Value& v) { assign(c.MEMBER, v); },       \
      [](const JobConfig& c) -> Value { return Value(c.MEMBER); }

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> specs = {
      {"job.name", Kind::kString, LOCKSTEP_FIELD(job.name)},
      {"job.world_size", Kind::kInt, LOCKSTEP_FIELD(job.world_size), 1, 65536},
      {"job.seed", Kind::kInt, LOCKSTEP_FIELD(job.seed), 0, 4.6e18},
      {"job.steps", Kind::kInt, LOCKSTEP_FIELD(job.steps), 0, 1e12},
      {"job.epochs", Kind::kFloat, LOCKSTEP_FIELD(job.epochs), 0, 1e6},
      {"job.run_dir", Kind::kString, LOCKSTEP_FIELD(job.run_dir)},
      {"job.log_every", Kind::kInt, LOCKSTEP_FIELD(job.log_every), 1, 1e12},
      {"job.threads_per_rank", Kind::kInt, LOCKSTEP_FIELD(job.threads_per_rank), 0, 4096},
      {"model.name", Kind::kString, LOCKSTEP_FIELD(model.name)},
      {"model.dropout", Kind::kFloat, LOCKSTEP_FIELD(model.dropout), 0, 0.99},
      {"model.path", Kind::kString, LOCKSTEP_FIELD(model.path), -kInf, kInf, false, {}, true},
      {"model.output", Kind::kString, LOCKSTEP_FIELD(model.output), -kInf, kInf, false, {}, true},
      {"loss.name", Kind::kString, LOCKSTEP_FIELD(loss.name), -kInf, kInf, false,
       {"cross_entropy", "mse", "l1", "bce_with_logits", "model"}},
      {"loss.label_smoothing", Kind::kFloat, LOCKSTEP_FIELD(loss.label_smoothing), 0, 0.999},
      {"data.name", Kind::kString, LOCKSTEP_FIELD(data.name), -kInf, kInf, false,
       {"fashion-mnist", "synthetic", "arrays", "images"}},
      {"data.path", Kind::kString, LOCKSTEP_FIELD(data.path)},
      {"data.train", Kind::kString, LOCKSTEP_FIELD(data.train), -kInf, kInf, false, {}, true},
      {"data.test", Kind::kString, LOCKSTEP_FIELD(data.test), -kInf, kInf, false, {}, true},
      {"data.validation", Kind::kString, LOCKSTEP_FIELD(data.validation), -kInf, kInf, false, {}, true},
      {"data.augment", Kind::kString, LOCKSTEP_FIELD(data.augment), -kInf, kInf, false, {}, true},
      {"data.inputs_key", Kind::kString, LOCKSTEP_FIELD(data.inputs_key)},
      {"data.targets_key", Kind::kString, LOCKSTEP_FIELD(data.targets_key)},
      {"data.scale", Kind::kFloat, LOCKSTEP_FIELD(data.scale), 0, 1e12, true},
      {"data.mean", Kind::kString, LOCKSTEP_FIELD(data.mean), -kInf, kInf, false, {}, true},
      {"data.std", Kind::kString, LOCKSTEP_FIELD(data.std), -kInf, kInf, false, {}, true},
      {"data.image_size", Kind::kString, LOCKSTEP_FIELD(data.image_size), -kInf, kInf, false, {}, true},
      {"data.channels", Kind::kInt, LOCKSTEP_FIELD(data.channels), 0, 3},
      {"data.workers", Kind::kInt, LOCKSTEP_FIELD(data.workers), 0, 256},
      {"data.bad_files", Kind::kString, LOCKSTEP_FIELD(data.bad_files), -kInf, kInf, false, {"error", "skip"}},
      {"data.batch_size", Kind::kInt, LOCKSTEP_FIELD(data.batch_size), 1, 1 << 20},
      {"data.global_batch", Kind::kInt, LOCKSTEP_FIELD(data.global_batch), 0, 1 << 30},
      {"data.microbatch", Kind::kInt, LOCKSTEP_FIELD(data.microbatch), 0, 1 << 20},
      {"data.synthetic_samples", Kind::kInt, LOCKSTEP_FIELD(data.synthetic_samples), 1, 1e8},
      {"data.prefetch", Kind::kInt, LOCKSTEP_FIELD(data.prefetch), 0, 64},
      {"data.missing_targets", Kind::kFloat, LOCKSTEP_FIELD(data.missing_targets), 0, 1},
      {"optim.name", Kind::kString, LOCKSTEP_FIELD(optim.name), -kInf, kInf, false,
       {"sgd", "adamw", "adam", "rmsprop"}},
      {"optim.lr", Kind::kFloat, LOCKSTEP_FIELD(optim.lr), 0, 1e3, true},
      {"optim.momentum", Kind::kFloat, LOCKSTEP_FIELD(optim.momentum), 0, 0.9999},
      {"optim.weight_decay", Kind::kFloat, LOCKSTEP_FIELD(optim.weight_decay), 0, 1e3},
      {"optim.nesterov", Kind::kBool, LOCKSTEP_FIELD(optim.nesterov)},
      {"optim.beta1", Kind::kFloat, LOCKSTEP_FIELD(optim.beta1), 0, 0.99999},
      {"optim.beta2", Kind::kFloat, LOCKSTEP_FIELD(optim.beta2), 0, 0.99999999},
      {"optim.eps", Kind::kFloat, LOCKSTEP_FIELD(optim.eps), 0, 1, true},
      {"optim.alpha", Kind::kFloat, LOCKSTEP_FIELD(optim.alpha), 0, 0.99999999},
      {"optim.clip_norm", Kind::kFloat, LOCKSTEP_FIELD(optim.clip_norm), 0, 1e12},
      {"optim.warmup_steps", Kind::kInt, LOCKSTEP_FIELD(optim.warmup_steps), 0, 1e12},
      {"optim.schedule", Kind::kString, LOCKSTEP_FIELD(optim.schedule), -kInf, kInf, false,
       {"constant", "cosine"}},
      {"train.accum_steps", Kind::kInt, LOCKSTEP_FIELD(train.accum_steps), 1, 1e6},
      {"eval.every", Kind::kInt, LOCKSTEP_FIELD(eval.every), 0, 1e12},
      {"eval.batch_size", Kind::kInt, LOCKSTEP_FIELD(eval.batch_size), 1, 1 << 20},
      {"comm.backend", Kind::kString, LOCKSTEP_FIELD(comm.backend), -kInf, kInf, false,
       {"auto", "gloo", "nccl"}},
      {"comm.bucket_mb", Kind::kFloat, LOCKSTEP_FIELD(comm.bucket_mb), 0, 1024, true},
      {"comm.overlap", Kind::kBool, LOCKSTEP_FIELD(comm.overlap)},
      {"comm.summation", Kind::kString, LOCKSTEP_FIELD(comm.summation), -kInf, kInf, false, {"exact", "float"}},
      {"comm.unused_parameters", Kind::kString, LOCKSTEP_FIELD(comm.unused_parameters), -kInf,
       kInf, false, {"error", "zero"}},
      {"comm.buffers", Kind::kString, LOCKSTEP_FIELD(comm.buffers), -kInf, kInf, false,
       {"auto", "mean", "broadcast", "average", "local"}},
      {"comm.barrier_timeout_s", Kind::kFloat, LOCKSTEP_FIELD(comm.barrier_timeout_s), 0.001, 86400},
      {"comm.collective_timeout_s", Kind::kFloat, LOCKSTEP_FIELD(comm.collective_timeout_s), 0.001,
       86400},
      {"comm.interface", Kind::kString, LOCKSTEP_FIELD(comm.interface), -kInf, kInf, false, {},
       true},
      {"comm.rendezvous_timeout_s", Kind::kFloat, LOCKSTEP_FIELD(comm.rendezvous_timeout_s), 0.001,
       86400},
      {"audit.every", Kind::kInt, LOCKSTEP_FIELD(audit.every), 0, 1e12},
      {"audit.policy", Kind::kString, LOCKSTEP_FIELD(audit.policy), -kInf, kInf, false,
       {"warn", "fail", "resync"}},
      {"audit.buffers", Kind::kString, LOCKSTEP_FIELD(audit.buffers), -kInf, kInf, false,
       {"check", "sync", "ignore"}},
      {"audit.verify_every", Kind::kInt, LOCKSTEP_FIELD(audit.verify_every), 0, 1e12},
      {"audit.on_miscompute", Kind::kString, LOCKSTEP_FIELD(audit.on_miscompute), -kInf, kInf, false,
       {"warn", "fail", "exclude"}},
      {"checkpoint.every", Kind::kInt, LOCKSTEP_FIELD(checkpoint.every), 0, 1e12},
      {"checkpoint.keep", Kind::kInt, LOCKSTEP_FIELD(checkpoint.keep), 1, 1000},
      {"checkpoint.resume", Kind::kString, LOCKSTEP_FIELD(checkpoint.resume), -kInf, kInf, false,
       {}, true},
      {"fault.max_restarts", Kind::kInt, LOCKSTEP_FIELD(fault.max_restarts), 0, 1000},
      {"fault.inject", Kind::kString, LOCKSTEP_FIELD(fault.inject), -kInf, kInf, false, {}, true},
      {"fault.heartbeat_s", Kind::kFloat, LOCKSTEP_FIELD(fault.heartbeat_s), 0.001, 3600},
      {"fault.heartbeat_timeout_s", Kind::kFloat, LOCKSTEP_FIELD(fault.heartbeat_timeout_s), 0.001,
       86400},
      {"elastic.min_ranks", Kind::kInt, LOCKSTEP_FIELD(elastic.min_ranks), 0, 65536},
      {"elastic.max_ranks", Kind::kInt, LOCKSTEP_FIELD(elastic.max_ranks), 0, 65536},
      {"elastic.replace_wait_s", Kind::kFloat, LOCKSTEP_FIELD(elastic.replace_wait_s), 0, 86400},
      {"elastic.max_host_losses", Kind::kInt, LOCKSTEP_FIELD(elastic.max_host_losses), 1, 1000},
      {"device", Kind::kString, LOCKSTEP_FIELD(device), -kInf, kInf, false,
       {"auto", "cpu", "gpu"}},
      {"precision.dtype", Kind::kString, LOCKSTEP_FIELD(precision.dtype), -kInf, kInf, false,
       {"auto", "fp32", "bf16", "fp16"}},
      {"precision.allow_emulated", Kind::kBool, LOCKSTEP_FIELD(precision.allow_emulated)},
      {"precision.fp32_modules", Kind::kString, LOCKSTEP_FIELD(precision.fp32_modules), -kInf,
       kInf, false, {}, true},
      {"precision.scaler", Kind::kString, LOCKSTEP_FIELD(precision.scaler), -kInf, kInf, false,
       {"auto", "on", "off"}},
      {"precision.init_scale", Kind::kFloat, LOCKSTEP_FIELD(precision.init_scale), 0, 1e30},
      {"precision.growth_interval", Kind::kInt, LOCKSTEP_FIELD(precision.growth_interval), 0, 1e9},
      {"precision.max_skipped_share", Kind::kFloat, LOCKSTEP_FIELD(precision.max_skipped_share), 0, 1},
      {"precision.check_overflow", Kind::kBool, LOCKSTEP_FIELD(precision.check_overflow)},
      {"test.no_reseed", Kind::kBool, LOCKSTEP_FIELD(test.no_reseed)},
      {"test.hold_rank", Kind::kInt, LOCKSTEP_FIELD(test.hold_rank), -1, 4095},
      {"test.hold_s", Kind::kFloat, LOCKSTEP_FIELD(test.hold_s), 0, 3600},
      {"test.fail_rank", Kind::kInt, LOCKSTEP_FIELD(test.fail_rank), -1, 4095},
      {"test.fail_step", Kind::kInt, LOCKSTEP_FIELD(test.fail_step), -1, 1e12},
      {"test.fail_kind", Kind::kString, LOCKSTEP_FIELD(test.fail_kind), -kInf, kInf, false,
       {"exit", "kill", "nan_loss"}},
      {"test.fail_generations", Kind::kInt, LOCKSTEP_FIELD(test.fail_generations), 0, 1000},
      {"test.probe_fault_rank", Kind::kInt, LOCKSTEP_FIELD(test.probe_fault_rank), -1, 65535},
  };
  return specs;
}
#undef LOCKSTEP_FIELD

std::string join_names(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string kind_name(Kind kind) {
  switch (kind) {
    case Kind::kInt: return "an integer";
    case Kind::kFloat: return "a number";
    case Kind::kBool: return "true or false";
    case Kind::kString: return "a string";
  }
  return "?";
}

// "an integer >= 1", "a number in (0, 1024]", "one of: sgd, adamw".
std::string allowed(const KeySpec& spec) {
  if (!spec.choices.empty()) return "one of: " + join_names(spec.choices, ", ");
  std::string text = kind_name(spec.kind);
  bool has_min = spec.min > -kInf, has_max = spec.max < kInf;
  if (has_min && has_max) {
    text += " in " + std::string(spec.min_open ? "(" : "[") + format_number(spec.min) + ", " +
            format_number(spec.max) + "]";
  } else if (has_min) {
    text += (spec.min_open ? " > " : " >= ") + format_number(spec.min);
  } else if (spec.kind == Kind::kString && !spec.allow_empty) {
    text = "a non-empty string";
  }
  return text;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

const KeySpec* find_spec(std::string key) {
  if (key == "precision") key = "precision.dtype";  // `precision = "bf16"`, `--set precision=bf16`
  for (const auto& spec : schema())
    if (spec.key == key) return &spec;
  return nullptr;
}

std::vector<std::string> effective_settings(const JobConfig& config) {
  std::vector<std::string> out;
  for (const auto& spec : schema()) {
    std::string text = std::visit(
        [](const auto& v) -> std::string {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::string>) return v;
          else if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
          else if constexpr (std::is_same_v<T, double>) {
            char buffer[64];
            std::snprintf(buffer, sizeof buffer, "%.17g", v);
            return buffer;
          } else return std::to_string(v);
        },
        spec.get(config));
    out.push_back(spec.key + "=" + text);
  }
  return out;
}

namespace {

// A value as TOML writes it: strings quoted (JSON's escapes are TOML's),
// floats always with a point or exponent, so they read back as floats.
std::string toml_value(const Value& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) return nlohmann::json(v).dump();
        else if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, double>) {
          if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
          char buffer[64];
          for (int digits = 15; digits <= 17; ++digits) {  // the shortest that reads back the same
            std::snprintf(buffer, sizeof buffer, "%.*g", digits, v);
            if (std::strtod(buffer, nullptr) == v) break;
          }
          std::string text = buffer;
          if (text.find_first_of(".en") == std::string::npos) text += ".0";
          return text;
        } else return std::to_string(v);
      },
      value);
}

std::string type_name(Kind kind) {
  switch (kind) {
    case Kind::kInt: return "integer";
    case Kind::kFloat: return "number";
    case Kind::kBool: return "bool";
    case Kind::kString: return "string";
  }
  return "?";
}

}  // namespace

std::string effective_toml(const JobConfig& config) {
  std::string top, sections, current;
  for (const auto& spec : schema()) {
    const auto dot = spec.key.find('.');
    const auto found = config.sources.find(spec.key);
    const std::string line = spec.key.substr(dot == std::string::npos ? 0 : dot + 1) + " = " +
                             toml_value(spec.get(config)) + "  # " +
                             (found == config.sources.end() ? "default" : found->second) + "\n";
    if (dot == std::string::npos) {
      top += line;
      continue;
    }
    const std::string section = spec.key.substr(0, dot);
    if (section != current) {
      sections += "\n[" + section + "]\n";
      current = section;
    }
    sections += line;
  }
  return "# lockstep " LOCKSTEP_VERSION ": the effective configuration of " + config.job_file + "\n" + top + sections;
}

nlohmann::json describe_keys() {
  const JobConfig defaults;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& spec : schema())
    out.push_back({{"key", spec.key}, {"type", type_name(spec.kind)}, {"default", toml_value(spec.get(defaults))},
                   {"allowed", allowed(spec)}});
  return out;
}

nlohmann::json to_json(const JobConfig& config) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& spec : schema()) {
    auto dot = spec.key.find('.');
    nlohmann::json& slot = dot == std::string::npos
                               ? out[spec.key]
                               : out[spec.key.substr(0, dot)][spec.key.substr(dot + 1)];
    std::visit([&](const auto& v) { slot = v; }, spec.get(config));
  }
  return out;
}

}  // namespace lockstep

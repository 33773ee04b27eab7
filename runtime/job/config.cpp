#include "runtime/job/config.h"

#include "lockstep/build_config.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <variant>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <toml++/toml.h>

#include "runtime/base/errors.h"
#include "runtime/job/keys.h"

namespace lockstep {
namespace {

[[noreturn]] void unknown_key(const std::string& where, const std::string& key) {
  std::string best;
  size_t best_distance = 3;
  for (const auto& spec : schema()) {
    size_t d = edit_distance(key, spec.key);
    if (d < best_distance) best_distance = d, best = spec.key;
  }
  std::string hint = best.empty() ? "" : " (did you mean '" + best + "'?)";
  throw InputError(where + ": unknown key '" + key + "'" + hint + "; known keys: " +
                   join_names(known_keys(), ", "));
}

// Checks range and choices; throws naming the key.
void check_value(const std::string& where, const KeySpec& spec, const Value& value,
                 const std::string& shown) {
  auto fail = [&] {
    throw InputError(where + ": key '" + spec.key + "' must be " + allowed(spec) + ", got " +
                     shown);
  };
  if (spec.kind == Kind::kInt || spec.kind == Kind::kFloat) {
    double x = spec.kind == Kind::kInt ? double(std::get<int64_t>(value)) : std::get<double>(value);
    if (!std::isfinite(x) || x < spec.min || x > spec.max || (spec.min_open && x == spec.min))
      fail();
  } else if (spec.kind == Kind::kString) {
    const auto& s = std::get<std::string>(value);
    if (s.empty() && !spec.allow_empty) fail();
    if (!spec.choices.empty() &&
        std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end())
      fail();
  }
}

// job.steps and job.epochs say the same thing two ways: a later source
// (the command line over the job file) that sets one clears the other, said
// as a decision; both from one source stay an error (validate).
void settle_run_length(JobConfig& config, const KeySpec& spec, const Value& value,
                       const std::string& source) {
  if (spec.key != "job.steps" && spec.key != "job.epochs") return;
  const bool steps = spec.key == "job.steps";
  const bool set = steps ? std::get<int64_t>(value) > 0 : std::get<double>(value) > 0;
  const std::string other = steps ? "job.epochs" : "job.steps";
  const bool other_set = steps ? config.job.epochs > 0 : config.job.steps > 0;
  if (!set || !other_set || config.sources[other] == source) return;
  const std::string was = steps ? format_number(config.job.epochs) : std::to_string(config.job.steps);
  const std::string now = steps ? std::to_string(std::get<int64_t>(value)) + " steps"
                                : format_number(std::get<double>(value)) + " epochs";
  ConfigDecision d{"run_length", now,
                   source + " sets " + spec.key + ", which replaces " + other + " = " + was +
                       " from " + config.sources[other]};
  spdlog::info("Decision: {} = {} ({})", d.what, d.value, d.reason);
  config.decisions.push_back(d);
  if (steps) config.job.epochs = 0;
  else config.job.steps = 0;
  config.sources[other] = "cleared by " + source + " " + spec.key;
}

void set_value(JobConfig& config, const KeySpec& spec, const Value& value,
               const std::string& where, const std::string& shown, const std::string& source) {
  check_value(where, spec, value, shown);
  settle_run_length(config, spec, value, source);
  spec.set(config, value);
  config.sources[spec.key] = source;
}


// Keys whose value is a list of numbers written as text ("28,28", "0.5"):
// a TOML number or array of numbers is taken as that text too.
bool is_number_list(const std::string& key) {
  return key == "data.image_size" || key == "data.mean" || key == "data.std";
}

std::optional<std::string> number_text(const toml::node& node) {
  if (auto v = node.value_exact<int64_t>()) return std::to_string(*v);
  if (auto v = node.value_exact<double>()) return fmt::format("{}", *v);  // shortest text that reads back the same
  return std::nullopt;
}

Value from_toml(const std::string& where, const KeySpec& spec, const toml::node& node) {
  auto wrong = [&](const std::string& got) -> Value {
    throw InputError(where + ": key '" + spec.key + "' must be " + allowed(spec) + ", got " + got);
  };
  switch (spec.kind) {
    case Kind::kInt:
      if (auto v = node.value_exact<int64_t>()) return *v;
      break;
    case Kind::kFloat:
      if (auto v = node.value_exact<double>()) return *v;
      if (auto v = node.value_exact<int64_t>()) return double(*v);
      break;
    case Kind::kBool:
      if (auto v = node.value_exact<bool>()) return *v;
      break;
    case Kind::kString:
      if (auto v = node.value_exact<std::string>()) return *v;
      if (is_number_list(spec.key)) {  // 28, 0.5, [28, 28], [0.5, 0.5, 0.5] -> "28", "0.5,0.5,0.5"
        if (auto text = number_text(node)) return *text;
        if (const toml::array* items = node.as_array(); items && !items->empty()) {
          std::string joined;
          bool all_numbers = true;
          for (const auto& item : *items) {
            auto text = number_text(item);
            all_numbers &= bool(text);
            if (text) joined += (joined.empty() ? "" : ",") + *text;
          }
          if (all_numbers) return joined;
        }
      }
      if (const toml::array* items = node.as_array();
          items && (spec.key == "precision.fp32_modules" || spec.key == "data.augment")) {
        std::string joined;  // a list of names: ["fc", "head"] -> "fc,head"
        bool all_strings = true;
        for (const auto& item : *items) {
          auto text = item.value_exact<std::string>();
          all_strings &= bool(text);
          if (text) joined += (joined.empty() ? "" : ",") + *text;
        }
        if (all_strings) return joined;
      }
      break;
  }
  std::ostringstream shown;
  shown << node.type() << " ";
  if (node.is_table()) shown << "(a table)";
  else if (node.is_array()) shown << "(an array)";
  else node.visit([&](auto&& n) { shown << n; });
  return wrong(shown.str());
}

Value from_text(const std::string& where, const KeySpec& spec, std::string text) {
  auto wrong = [&]() -> Value {
    throw InputError(where + ": key '" + spec.key + "' must be " + allowed(spec) + ", got '" +
                     text + "'");
  };
  switch (spec.kind) {
    case Kind::kInt: {
      int64_t v = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || end != text.data() + text.size()) return wrong();
      return v;
    }
    case Kind::kFloat: {
      char* end = nullptr;
      double v = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size()) return wrong();
      return v;
    }
    case Kind::kBool:
      if (text == "true") return true;
      if (text == "false") return false;
      return wrong();
    case Kind::kString:
      if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
          text.back() == text.front())
        text = text.substr(1, text.size() - 2);
      if (is_number_list(spec.key) && text.size() >= 2 && text.front() == '[' && text.back() == ']')
        text = text.substr(1, text.size() - 2);  // --set data.image_size=[28,28]
      return text;
  }
  return wrong();
}

void apply_table(JobConfig& config, const toml::table& table, const std::string& prefix,
                 const std::string& file) {
  for (const auto& [raw_key, node] : table) {
    std::string key = prefix.empty() ? std::string(raw_key.str())
                                     : prefix + "." + std::string(raw_key.str());
    const KeySpec* spec = find_spec(key);
    std::string where = file;
    if (auto line = node.source().begin.line) where += ":" + std::to_string(line);
    if (spec && node.is_table() && prefix.empty() && key == "precision") {
      apply_table(config, *node.as_table(), key, file);  // [precision] with dtype = ...
      continue;
    }
    if (!spec && node.is_table() && prefix.empty()) {
      bool known_section = false;
      for (const auto& s : schema()) known_section |= s.key.rfind(key + ".", 0) == 0;
      if (!known_section) unknown_key(where, key);
      apply_table(config, *node.as_table(), key, file);
      continue;
    }
    if (!spec) unknown_key(where, key);
    Value value = from_toml(where, *spec, node);
    std::ostringstream shown;
    node.visit([&](auto&& n) { shown << n; });
    set_value(config, *spec, value, where, shown.str(), file);
  }
}

}  // namespace

std::string format_number(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

std::vector<std::string> known_keys() {
  std::vector<std::string> keys;
  for (const auto& spec : schema()) keys.push_back(spec.key);
  return keys;
}

void apply_overrides(JobConfig& config, const std::vector<std::string>& overrides) {
  for (const auto& item : overrides) {
    std::string where = "--set " + item;
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError(where + ": expected key=value, for example --set optim.lr=0.1");
    std::string key = item.substr(0, eq);
    const KeySpec* spec = find_spec(key);
    if (!spec) unknown_key(where, key);
    std::string text = item.substr(eq + 1);
    set_value(config, *spec, from_text(where, *spec, text), where, "'" + text + "'", "--set");
  }
}

JobConfig load_job_config(const std::string& path, const std::vector<std::string>& overrides) {
  JobConfig config;
  for (const auto& spec : schema()) config.sources[spec.key] = "default";
  config.job_file = path;
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source();
    if (!where.path || e.description().find("File could not be opened") != std::string::npos)
      throw InputError(path + ": cannot read job file (" + std::string(e.description()) + ")");
    throw InputError(path + ":" + std::to_string(where.begin.line) + ": TOML syntax error: " +
                     std::string(e.description()));
  }
  apply_table(config, table, "", path);
  apply_overrides(config, overrides);
  validate(config);
  resolve_global_batch(config);
  if (config.data.name == "images" && config.sources["data.scale"] == "default") {
    config.data.scale = 1.0 / 255.0;
    ConfigDecision d{"data.scale", "1/255", "data.name = images: 8-bit pixels become 0 to 1; set "
                                            "data.scale to choose another"};
    spdlog::info("Decision: {} = {} ({})", d.what, d.value, d.reason);
    config.decisions.push_back(d);
  }
  return config;
}

}  // namespace lockstep

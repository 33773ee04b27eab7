#include "report/run_record.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/base/errors.h"
#include "runtime/base/untrusted_json.h"

namespace lockstep::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double number(const json& object, const char* key, double fallback = 0) {
  auto it = object.find(key);
  return it != object.end() && it->is_number() ? it->get<double>() : fallback;
}

// A whole number from an untrusted field, clamped so that a hostile 1e300
// cannot overflow the cast.
int64_t integer(const json& object, const char* key, int64_t fallback = 0) {
  const double value = number(object, key, double(fallback));
  return int64_t(std::clamp(value, -9.0e15, 9.0e15));
}

bool flag(const json& object, const char* key, bool fallback) {
  auto it = object.find(key);
  return it != object.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

std::string text(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

// "optim.lr" -> "0.05" for every key of the manifest's sections.
void flatten_settings(const json& config, std::map<std::string, std::string>& out) {
  for (const auto& [section, keys] : config.items()) {
    if (!keys.is_object()) {
      out[section] = keys.is_string() ? keys.get<std::string>() : keys.dump();
      continue;
    }
    for (const auto& [key, value] : keys.items())
      out[section + "." + key] = value.is_string() ? value.get<std::string>() : value.dump();
  }
}

// Each line a JSON object; a line that is not (a torn last line of a run
// that was killed), or is longer than JsonLimits allows, is counted, not
// fatal. Only a regular file is read (a FIFO would block, /dev/zero never
// ends), in chunks, so no line is ever held past the limit.
std::vector<json> read_jsonl(const fs::path& file, std::vector<std::string>& problems) {
  std::vector<json> out;
  std::error_code error;
  if (!fs::is_regular_file(file, error)) {
    if (fs::exists(file, error)) problems.push_back(file.string() + ": not a regular file; left out");
    return out;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return out;
  const size_t max_line = JsonLimits{}.max_bytes;
  std::string line, why;
  bool too_long = false;
  int64_t unreadable = 0, number = 0, first_bad = 0;
  auto finish_line = [&] {
    ++number;
    if (too_long || !line.empty()) {
      json value = too_long ? json(json::value_t::discarded) : parse_untrusted_json(line, &why);
      if (value.is_discarded() || !value.is_object()) {
        if (unreadable++ == 0) first_bad = number;
      } else {
        out.push_back(std::move(value));
      }
    }
    line.clear();
    too_long = false;
  };
  std::vector<char> chunk(1 << 16);
  while (in) {
    in.read(chunk.data(), std::streamsize(chunk.size()));
    const size_t got = size_t(in.gcount());
    for (size_t at = 0; at < got;) {
      const char* newline = static_cast<const char*>(std::memchr(chunk.data() + at, '\n', got - at));
      const size_t end = newline ? size_t(newline - chunk.data()) : got;
      if (!too_long) {
        if (line.size() + (end - at) > max_line) {
          too_long = true;
          line.clear();
        } else {
          line.append(chunk.data() + at, end - at);
        }
      }
      at = end;
      if (newline) {
        finish_line();
        ++at;
      }
    }
  }
  if (too_long || !line.empty()) finish_line();
  if (unreadable > 0)
    problems.push_back(fmt::format("{}: {} line(s) are not JSON objects, the first line {} (a run "
                                   "killed mid-write leaves a torn last line); they are left out",
                                   file.string(), unreadable, first_bad));
  return out;
}

void read_rank_events(const fs::path& file, int rank, RunRecord& run) {
  std::map<std::tuple<std::string, std::string, std::string>, size_t> decision_index;
  for (const auto& d : run.decisions)
    decision_index[{d.what, d.value, d.reason}] = size_t(&d - run.decisions.data());
  int generation = 1;
  size_t last_step_row = SIZE_MAX;  // index in run.steps; its totals stand in for a missing end
  bool ended = false;
  for (const json& event : read_jsonl(file, run.problems)) {
    const std::string kind = text(event, "event");
    if (kind == "resumed") ++generation;
    if (kind == "step") {
      StepRow row;
      row.rank = rank;
      row.generation = generation;
      row.step = integer(event, "step");
      row.time = number(event, "time");
      row.loss = number(event, "loss");
      row.lr = number(event, "lr");
      row.samples_per_s = number(event, "samples_per_s");
      if (auto phases = event.find("phases"); phases != event.end() && phases->is_object())
        for (const auto& [name, seconds] : phases->items())
          if (seconds.is_number()) row.phases[name] = seconds.get<double>();
      run.last_step = std::max(run.last_step, row.step);
      run.steps.push_back(std::move(row));
      last_step_row = run.steps.size() - 1;
    } else if (kind == "first_step") {
      run.total_steps = std::max<int64_t>(run.total_steps, integer(event, "total_steps"));
      run.last_step = std::max(run.last_step, integer(event, "step"));
    } else if (kind == "eval") {
      EvalRow row{rank, integer(event, "step"), text(event, "split"), {}};
      if (auto metrics = event.find("metrics"); metrics != event.end() && metrics->is_object())
        for (const auto& [name, value] : metrics->items())
          if (value.is_number() && name != "targets") row.metrics[name] = value.get<double>();
      run.evals.push_back(std::move(row));
    } else if (kind == "audit_result" && rank == 0) {
      run.audits.push_back({integer(event, "step"), flag(event, "agreed", true),
                            number(event, "max_abs_diff"), text(event, "verdict")});
    } else if (kind == "decision") {
      std::tuple<std::string, std::string, std::string> key{text(event, "what"), text(event, "value"),
                                                            text(event, "reason")};
      auto found = decision_index.find(key);
      if (found == decision_index.end()) {
        found = decision_index.emplace(key, run.decisions.size()).first;
        run.decisions.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), {}});
      }
      auto& ranks = run.decisions[found->second].ranks;
      if (std::find(ranks.begin(), ranks.end(), rank) == ranks.end()) ranks.push_back(rank);
    } else if (kind == "end") {
      ended = true;
      run.phases_by_rank[rank].clear();
      if (auto phases = event.find("phases"); phases != event.end() && phases->is_object())
        for (const auto& [name, seconds] : phases->items())
          if (seconds.is_number()) run.phases_by_rank[rank][name] = seconds.get<double>();
    }
  }
  if (!ended && last_step_row != SIZE_MAX) run.phases_by_rank[rank] = run.steps[last_step_row].phases;
}

// The first audit where the ranks parted, in words, from the coordinator's
// (or rank 0's) findings: tensors, rank groups, the largest difference.
std::string describe_first_drift(const fs::path& folder, RunRecord& run) {
  for (const char* name : {"audit.jsonl", "audit-rank0.jsonl"}) {
    if (!fs::exists(folder / name)) continue;
    for (const json& audit : read_jsonl(folder / name, run.problems)) {
      if (flag(audit, "agreed", true) || integer(audit, "step") != run.first_drift_step) continue;
      const std::string verdict = text(audit, "verdict");
      if (!verdict.empty()) return verdict;
    }
  }
  for (const auto& mark : run.audits)
    if (!mark.agreed) return mark.verdict;
  return "";
}

}  // namespace

RunRecord load_run(const std::string& folder_name) {
  const fs::path folder(folder_name);
  RunRecord run;
  run.folder = folder_name;
  run.run_id = folder.filename().string();
  if (run.run_id.empty()) run.run_id = folder.parent_path().filename().string();
  std::error_code error;
  if (!fs::is_directory(folder, error))
    throw InputError(folder_name + ": no such folder; give a run folder (runs/<run-id>)");

  json manifest;
  std::string manifest_problem;
  if (fs::exists(folder / "manifest.json", error) && !fs::is_regular_file(folder / "manifest.json", error)) {
    manifest_problem = (folder / "manifest.json").string() + " is not a regular file";
    run.problems.push_back(manifest_problem);
    manifest = json::object();
  } else if (std::ifstream in(folder / "manifest.json"); in) {
    std::string why;
    manifest = parse_untrusted_json(in, &why);
    if (manifest.is_discarded() || !manifest.is_object()) {
      manifest_problem = (folder / "manifest.json").string() + " is unreadable (" +
                         (why.empty() ? std::string("not a JSON object") : why) + ")";
      run.problems.push_back(manifest_problem);
      manifest = json::object();
    }
  } else {
    run.problems.push_back((folder / "manifest.json").string() +
                           ": missing (the run ended before rank 0 wrote it, or this is not a run "
                           "folder); settings and outcome are unknown");
    manifest = json::object();
  }
  if (const std::string id = text(manifest, "run_id"); !id.empty()) run.run_id = id;
  run.status = text(manifest, "status");
  run.started_at = text(manifest, "started_at");
  run.finished_at = text(manifest, "finished_at");
  // As `lockstep audit` allows: a world size past this is a damaged manifest.
  constexpr int kMaxRanks = 65536;
  if (manifest.contains("world_size")) {
    const double world = number(manifest, "world_size", -1);
    if (!(world >= 1 && world <= kMaxRanks) || world != double(int64_t(world)))
      throw InputError((folder / "manifest.json").string() + ": world_size " + manifest["world_size"].dump() +
                       " is not a whole number from 1 to " + std::to_string(kMaxRanks) + " (a damaged manifest)");
    run.world_size = int(world);
  }
  if (auto config = manifest.find("config"); config != manifest.end() && config->is_object())
    flatten_settings(*config, run.settings);
  if (auto sources = manifest.find("config_sources"); sources != manifest.end() && sources->is_object())
    for (const auto& [key, source] : sources->items())
      if (source.is_string()) run.sources[key] = source.get<std::string>();
  if (auto metrics = manifest.find("metrics"); metrics != manifest.end() && metrics->is_object())
    for (const auto& [name, value] : metrics->items())
      if (value.is_number()) run.final_metrics[name] = value.get<double>();
  if (auto it = run.settings.find("job.steps"); it != run.settings.end())
    run.total_steps = std::max<int64_t>(0, std::atoll(it->second.c_str()));
  const json coordinator = manifest.value("coordinator", json::object());
  run.first_drift_step = integer(manifest, "first_drift_step", integer(coordinator, "first_drift_step", -1));

  // Ranks: the event files there are (each read once, whatever its number
  // claims), and those the manifest's world size says should be there.
  std::set<int> ranks;
  for (int rank = 0; rank < run.world_size; ++rank) ranks.insert(rank);
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    const std::string name = entry.path().filename().string();
    const std::string prefix = "events-rank", suffix = ".jsonl";
    if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (digits.size() > 5 || std::stoi(digits) >= kMaxRanks) {
      run.problems.push_back((folder / name).string() + ": rank " + digits + " is past the " +
                             std::to_string(kMaxRanks) + " ranks a job can have; left out");
      continue;
    }
    ranks.insert(std::stoi(digits));
  }
  if (ranks.empty() && manifest.empty())
    throw InputError(folder_name + ": not a run folder (" +
                     (manifest_problem.empty() ? std::string("no manifest.json") : manifest_problem) +
                     ", and no events-rank<N>.jsonl); give runs/<run-id>");
  if (run.world_size == 0) run.world_size = ranks.empty() ? 0 : *ranks.rbegin() + 1;
  for (int rank : ranks) {
    const fs::path file = folder / ("events-rank" + std::to_string(rank) + ".jsonl");
    if (!fs::exists(file)) {
      run.problems.push_back(file.string() + ": missing (rank " + std::to_string(rank) +
                             " wrote no events here; on several hosts it writes into its own host's folder)");
      continue;
    }
    read_rank_events(file, rank, run);
  }
  std::sort(run.audits.begin(), run.audits.end(),
            [](const AuditMark& a, const AuditMark& b) { return a.step < b.step; });
  if (run.first_drift_step < 0)
    for (const auto& mark : run.audits)
      if (!mark.agreed) {
        run.first_drift_step = mark.step;
        break;
      }
  if (run.first_drift_step >= 0) run.first_drift = describe_first_drift(folder, run);

  if (auto restarts = manifest.find("restarts"); restarts != manifest.end() && restarts->is_array())
    for (const json& r : *restarts) {
      if (!r.is_object()) continue;
      run.restarts.push_back({int(integer(r, "generation")), int(std::clamp<int64_t>(integer(r, "dead_rank", -1), -1, kMaxRanks)),
                              integer(r, "resumed_from_step", -1), integer(r, "steps_reached", -1),
                              integer(r, "steps_redone", -1), number(r, "recovery_s", -1),
                              text(r, "reason")});
    }

  if (auto coordinator = manifest.find("coordinator"); coordinator != manifest.end() && coordinator->is_object())
    if (auto changes = coordinator->find("membership"); changes != coordinator->end() && changes->is_array())
      for (const json& m : *changes) {
        if (!m.is_object()) continue;
        run.membership.push_back({int(integer(m, "generation")), integer(m, "resumed_from_step", integer(m, "step", -1)),
                                  int(std::clamp<int64_t>(integer(m, "world_size_before"), 0, kMaxRanks)),
                                  int(std::clamp<int64_t>(integer(m, "world_size"), 0, kMaxRanks)),
                                  text(m, "kind"), text(m, "reason"), number(m, "recovery_s", -1)});
      }

  if (auto phases = manifest.find("phases"); phases != manifest.end() && phases->is_object())
    run.wall_s = number(*phases, "wall");
  run.job_wall_s = number(manifest, "job_wall_s", -1);
  if (run.wall_s <= 0 && run.steps.size() > 1) {
    auto [first, last] = std::minmax_element(run.steps.begin(), run.steps.end(),
                                             [](const StepRow& a, const StepRow& b) { return a.time < b.time; });
    run.wall_s = last->time - first->time;
  }

  // Why it ended, in words.
  const std::string error_text = text(manifest, "error");
  const std::string failure = text(coordinator, "failure");
  if (run.status == "completed") {
    run.ending = "completed all " + std::to_string(run.last_step) + " steps";
  } else if (run.status == "completed_with_drift") {
    run.ending = "completed, but " + text(manifest, "drift");
  } else if (run.status == "running") {
    run.ending = "the manifest still says running: the job is running, or it was killed before it "
                 "could write its end (last step seen: " + std::to_string(run.last_step) + ")";
  } else if (run.status.empty()) {
    run.ending = "unknown (no manifest); last step seen: " + std::to_string(run.last_step);
  } else {
    run.ending = run.status + " at step " + std::to_string(run.last_step);
    const std::string why = !error_text.empty() ? error_text : failure;
    if (!why.empty()) run.ending += ": " + why;
    const std::string stop = text(manifest, "stop_reason");
    if (!stop.empty()) run.ending += " (" + stop + ")";
  }
  return run;
}

}  // namespace lockstep::report

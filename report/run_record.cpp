#include "report/run_record.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/errors.h"
#include "runtime/untrusted_json.h"

namespace lockstep::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double number(const json& object, const char* key, double fallback = 0) {
  auto it = object.find(key);
  return it != object.end() && it->is_number() ? it->get<double>() : fallback;
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
// that was killed) is counted, not fatal.
std::vector<json> read_jsonl(const fs::path& file, std::vector<std::string>& problems) {
  std::vector<json> out;
  std::ifstream in(file);
  if (!in) return out;
  std::string line, why;
  int64_t unreadable = 0, number = 0, first_bad = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    json value = parse_untrusted_json(line, &why);
    if (value.is_discarded() || !value.is_object()) {
      if (unreadable++ == 0) first_bad = number;
      continue;
    }
    out.push_back(std::move(value));
  }
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
      row.step = int64_t(number(event, "step"));
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
      run.total_steps = std::max<int64_t>(run.total_steps, int64_t(number(event, "total_steps")));
      run.last_step = std::max(run.last_step, int64_t(number(event, "step")));
    } else if (kind == "eval") {
      EvalRow row{rank, int64_t(number(event, "step")), text(event, "split"), {}};
      if (auto metrics = event.find("metrics"); metrics != event.end() && metrics->is_object())
        for (const auto& [name, value] : metrics->items())
          if (value.is_number() && name != "targets") row.metrics[name] = value.get<double>();
      run.evals.push_back(std::move(row));
    } else if (kind == "audit_result" && rank == 0) {
      run.audits.push_back({int64_t(number(event, "step")), event.value("agreed", true),
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
      if (audit.value("agreed", true) || int64_t(number(audit, "step")) != run.first_drift_step) continue;
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
  if (std::ifstream in(folder / "manifest.json"); in) {
    std::string why;
    manifest = parse_untrusted_json(in, &why);
    if (manifest.is_discarded() || !manifest.is_object()) {
      run.problems.push_back((folder / "manifest.json").string() + ": unreadable (" + why + ")");
      manifest = json::object();
    }
  } else {
    run.problems.push_back((folder / "manifest.json").string() +
                           ": missing (the run ended before rank 0 wrote it, or this is not a run "
                           "folder); settings and outcome are unknown");
    manifest = json::object();
  }
  run.run_id = manifest.value("run_id", run.run_id);
  run.status = text(manifest, "status");
  run.started_at = text(manifest, "started_at");
  run.finished_at = text(manifest, "finished_at");
  run.world_size = int(number(manifest, "world_size"));
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
  run.first_drift_step = int64_t(number(manifest, "first_drift_step",
                                        number(coordinator, "first_drift_step", -1)));

  // Ranks: as many event files as there are, or the manifest's world size.
  int ranks = run.world_size;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    static const std::regex events_file(R"(events-rank(\d+)\.jsonl)");
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, events_file)) ranks = std::max(ranks, std::stoi(match[1]) + 1);
  }
  if (ranks == 0 && manifest.empty())
    throw InputError(folder_name + ": not a run folder (no manifest.json and no events-rank<N>.jsonl); "
                     "give runs/<run-id>");
  if (run.world_size == 0) run.world_size = ranks;
  for (int rank = 0; rank < ranks; ++rank) {
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
      run.restarts.push_back({int(number(r, "generation")), int(number(r, "dead_rank", -1)),
                              int64_t(number(r, "resumed_from_step")), int64_t(number(r, "steps_reached")),
                              int64_t(number(r, "steps_redone")), number(r, "recovery_s", -1),
                              text(r, "reason")});
    }

  if (auto phases = manifest.find("phases"); phases != manifest.end() && phases->is_object())
    run.wall_s = number(*phases, "wall");
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

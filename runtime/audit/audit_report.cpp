#include "runtime/audit/audit_report.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sys/stat.h>

#include "runtime/base/untrusted_json.h"

namespace lockstep {
namespace {

using nlohmann::json;

// One rank's audits, by step.
struct RankEvidence {
  std::map<int64_t, json> by_step;
};

AuditReport bad_evidence(const std::vector<std::string>& problems) {
  AuditReport report;
  report.exit_code = 2;
  report.text = "cannot audit this run folder:\n";
  for (const auto& p : problems) report.text += "  - " + p + "\n";
  report.json = {{"verdict", "unreadable"}, {"problems", problems}};
  return report;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = "{";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out + "}";
}

}  // namespace

AuditReport audit_run_folder(const std::string& run_dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> problems;
  const std::string manifest_path = run_dir + "/manifest.json";
  int world = 0, world_max = 0;
  std::string run_status;  // the manifest's outcome, as the run recorded it
  // Evidence is read, never trusted: every file must be a regular file,
  // every line bounded JSON of the expected shape, and the ranks' files must
  // agree with the manifest and with each other.
  auto regular_file = [](const std::string& path) {
    struct stat info {};
    return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
  };
  if (!fs::exists(manifest_path))
    return bad_evidence({manifest_path + ": missing (is " + run_dir + " a run folder?)"});
  if (!regular_file(manifest_path)) return bad_evidence({manifest_path + ": not a regular file"});
  {
    std::ifstream in(manifest_path);
    if (!in) return bad_evidence({manifest_path + ": cannot be read"});
    std::string why;
    json manifest = parse_untrusted_json(in, &why);
    if (manifest.is_discarded())
      return bad_evidence({manifest_path + ": truncated or not a lockstep manifest (" + why + ")"});
    if (!manifest.is_object() || !manifest.contains("world_size") ||
        !manifest["world_size"].is_number_integer())
      return bad_evidence({manifest_path + ": not a lockstep manifest (no integer world_size)"});
    const int64_t stated = manifest["world_size"].get<int64_t>();
    if (stated < 1 || stated > 65536)
      return bad_evidence({manifest_path + ": world_size = " + std::to_string(stated) +
                           " (a run has 1 to 65536 ranks)"});
    world = static_cast<int>(stated);
    if (manifest.contains("status") && manifest["status"].is_string()) run_status = manifest["status"];
    // An elastic job whose world size changed (the coordinator recorded
    // each change): the most ranks it had. Without a recorded change the
    // manifest's world size is the only one.
    world_max = world;
    if (auto c = manifest.find("coordinator"); c != manifest.end() && c->is_object()) {
      auto m = c->find("world_size_max");
      auto changes = c->find("membership");
      if (m != c->end() && m->is_number_integer() && m->get<int64_t>() >= world && m->get<int64_t>() <= 65536 &&
          changes != c->end() && changes->is_array() && !changes->empty())
        world_max = int(m->get<int64_t>());
    }
  }
  // A rank file beyond the run's most ranks means one of them lies.
  if (fs::exists(run_dir + "/audit-rank" + std::to_string(world_max) + ".jsonl"))
    return bad_evidence({manifest_path + ": world_size = " + std::to_string(world_max) + " but audit-rank" +
                         std::to_string(world_max) + ".jsonl exists (inconsistent)"});

  std::vector<RankEvidence> ranks(static_cast<size_t>(world_max));
  for (int r = 0; r < world_max; ++r) {
    const std::string path = run_dir + "/audit-rank" + std::to_string(r) + ".jsonl";
    if (!fs::exists(path)) {
      if (r < world) problems.push_back(path + ": missing");
      continue;
    }
    if (!regular_file(path)) {
      problems.push_back(path + ": not a regular file");
      continue;
    }
    std::ifstream in(path);
    if (!in) {
      problems.push_back(path + ": cannot be read");
      continue;
    }
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.empty()) continue;
      std::string why;
      json audit = parse_untrusted_json(line, &why);
      if (audit.is_discarded()) {
        problems.push_back(path + ":" + std::to_string(number) + ": truncated or corrupt line (" + why + ")");
        break;
      }
      std::string shape;
      if (!audit.is_object() || !audit.contains("step") || !audit["step"].is_number_integer())
        shape = "no integer step";
      else if (!audit.contains("tensors") || !audit["tensors"].is_object() || audit["tensors"].empty())
        shape = "no tensors object";
      else if (audit.contains("rng") && !audit["rng"].is_string())
        shape = "rng is not a string";
      else if (audit.contains("world_size") &&
               (!audit["world_size"].is_number_integer() || audit["world_size"].get<int64_t>() < 1 ||
                audit["world_size"].get<int64_t>() > world_max || audit["world_size"].get<int64_t>() <= r))
        shape = "world_size is not one of this run's (1 to " + std::to_string(world_max) + ", above the rank)";
      if (shape.empty())
        for (const auto& [name, hash] : audit["tensors"].items())
          if (shape.empty() && !hash.is_string()) shape = "tensor " + name + " has no string digest";
      if (!shape.empty()) {
        problems.push_back(path + ":" + std::to_string(number) + ": not an audit line (" + shape + ")");
        break;
      }
      // A step audited again (a restart redid it) counts as its last audit.
      ranks[size_t(r)].by_step[audit["step"].get<int64_t>()] = audit;
    }
    if (ranks[size_t(r)].by_step.empty() && problems.empty() && r < world)
      problems.push_back(path + ": holds no audit");
  }
  if (!problems.empty()) return bad_evidence(problems);

  // Each audited step's ranks: as many as its evidence says the world had
  // then (rank 0's line; older evidence without it: the manifest's).
  std::set<int64_t> steps;
  for (const auto& r : ranks)
    for (const auto& [step, audit] : r.by_step) steps.insert(step);
  std::map<int64_t, int> world_at;
  for (int64_t step : steps) {
    auto line = ranks[0].by_step.find(step);
    const int w = line == ranks[0].by_step.end() ? world
                  : int(line->second.value("world_size", int64_t(world)));
    world_at[step] = w;
    for (int r = 0; r < w; ++r)
      if (!ranks[size_t(r)].by_step.count(step))
        problems.push_back("audit-rank" + std::to_string(r) + ".jsonl: no audit at step " +
                           std::to_string(step) + ", which other ranks audited (inconsistent)");
      else if (ranks[size_t(r)].by_step[step].value("world_size", int64_t(world)) != w)
        problems.push_back("audit-rank" + std::to_string(r) + ".jsonl: step " + std::to_string(step) +
                           " audited in a world of " +
                           std::to_string(ranks[size_t(r)].by_step[step].value("world_size", int64_t(world))) +
                           " ranks, rank 0's of " + std::to_string(w) + " (inconsistent)");
  }
  if (!problems.empty()) return bad_evidence(problems);

  AuditReport report;
  json rows = json::array();
  int64_t first_drift = -1, agreed_again = -1;
  std::vector<std::string> first_tensors;
  std::vector<std::vector<int>> first_groups;
  bool drifted_now = false, streams_shared = false;
  char line[512];
  std::snprintf(line, sizeof line, "%8s  %-8s  %-8s  %s\n", "step", "verdict", "streams", "differing tensors (rank groups)");
  report.text = line;
  std::set<int> world_sizes;
  for (int64_t step : steps) {
    const int world = world_at[step];  // this step's
    world_sizes.insert(world);
    const json& reference = ranks[0].by_step[step]["tensors"];
    for (int r = 1; r < world; ++r)
      for (const auto& [name, hash] : ranks[size_t(r)].by_step[step]["tensors"].items())
        if (!reference.contains(name))
          problems.push_back("audit-rank0.jsonl: step " + std::to_string(step) + " lacks tensor " + name +
                             ", which rank " + std::to_string(r) + " audited (inconsistent)");
    std::vector<std::string> differing;
    std::string detail;
    std::vector<std::vector<int>> groups_of_first;
    for (const auto& [name, hash] : reference.items()) {
      std::map<std::string, std::vector<int>> versions;
      for (int r = 0; r < world; ++r) {
        const json& tensors = ranks[size_t(r)].by_step[step]["tensors"];
        if (!tensors.contains(name)) {
          problems.push_back("audit-rank" + std::to_string(r) + ".jsonl: step " +
                             std::to_string(step) + " lacks tensor " + name + " (inconsistent)");
          continue;
        }
        versions[tensors[name].get<std::string>()].push_back(r);
      }
      if (versions.size() < 2) continue;
      differing.push_back(name);
      std::vector<std::vector<int>> groups;
      for (const auto& [h, rs] : versions) groups.push_back(rs);
      std::sort(groups.begin(), groups.end());
      if (groups_of_first.empty()) groups_of_first = groups;
      detail += (detail.empty() ? "" : ", ") + name + " (";
      for (size_t g = 0; g < groups.size(); ++g) detail += (g ? " vs " : "") + ranks_text(groups[g]);
      detail += ")";
    }
    std::set<std::string> rng;
    for (int r = 0; r < world; ++r) rng.insert(ranks[size_t(r)].by_step[step].value("rng", std::string()));
    const bool distinct = int(rng.size()) == world;
    streams_shared |= !distinct;
    const bool agreed = differing.empty();
    if (!agreed && first_drift < 0) {
      first_drift = step;
      first_tensors = differing;
      first_groups = groups_of_first;
    }
    if (agreed && drifted_now && agreed_again < 0) agreed_again = step;
    drifted_now = !agreed;
    std::snprintf(line, sizeof line, "%8lld  %-8s  %-8s  %s\n", static_cast<long long>(step),
                  agreed ? "agree" : "DRIFT", distinct ? "distinct" : "EQUAL", detail.c_str());
    report.text += line;
    rows.push_back({{"step", step}, {"agreed", agreed}, {"streams_distinct", distinct},
                    {"differing", differing}});
  }
  if (!problems.empty()) return bad_evidence(problems);

  report.json = {{"run_dir", run_dir}, {"world_size", world}, {"audits", rows},
                 {"streams_shared", streams_shared}};
  if (first_drift < 0) {
    report.exit_code = 0;
    std::string sizes;
    for (int w : world_sizes) sizes += (sizes.empty() ? "" : ", ") + std::to_string(w);
    report.text += "verdict: all " + (world_sizes.size() > 1 ? "ranks (" + sizes + " over the run)" : sizes + " ranks") +
                   " agreed at every one of " + std::to_string(steps.size()) + " audited steps\n";
    report.json["verdict"] = "agreed";
  } else {
    report.exit_code = 1;
    std::string tensors;
    for (const auto& t : first_tensors) tensors += (tensors.empty() ? "" : ", ") + t;
    std::string groups;
    for (size_t g = 0; g < first_groups.size(); ++g) groups += (g ? " vs " : "") + ranks_text(first_groups[g]);
    report.text += "verdict: the ranks DRIFTED: first parted at step " + std::to_string(first_drift) +
                   " in " + tensors + " (ranks " + groups + "); " +
                   (agreed_again >= 0 ? "agreed again at step " + std::to_string(agreed_again)
                                      : std::string("never agreed again")) + "\n";
    report.json["verdict"] = "drifted";
    report.json["first_drift_step"] = first_drift;
    report.json["first_drift_tensors"] = first_tensors;
    report.json["first_drift_groups"] = first_groups;
    report.json["agreed_again_step"] = agreed_again >= 0 ? json(agreed_again) : json(nullptr);
  }
  if (streams_shared)
    report.text += "warning: some ranks had equal random generator states at some audits "
                   "(identical dropout masks)\n";
  if (!run_status.empty()) {
    report.text += "run outcome (manifest.json): " + run_status + "\n";
    report.json["run_status"] = run_status;
  }
  return report;
}

}  // namespace lockstep

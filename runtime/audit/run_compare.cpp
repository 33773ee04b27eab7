#include "runtime/audit/run_compare.h"

#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "runtime/base/untrusted_json.h"

namespace lockstep {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxAuditLines = 1u << 20;  // a million audits: far beyond any run

struct RunEvidence {
  std::string folder;
  std::string final_digest;    // "" when the run did not finish
  std::string digest_kind;     // how tensors were digested ("" when not said)
  int64_t last_step = -1;
  std::map<int64_t, json> audits;  // rank 0's, by step (a redone step: its last audit)
  std::string problem;         // why it cannot be read
};

bool regular_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

RunEvidence read_run(const std::string& folder) {
  RunEvidence run;
  run.folder = folder;
  const std::string manifest_path = folder + "/manifest.json";
  if (!regular_file(manifest_path)) {
    run.problem = manifest_path + ": missing or not a regular file (is " + folder + " a run folder?)";
    return run;
  }
  {
    std::ifstream in(manifest_path);
    std::string why;
    const json manifest = parse_untrusted_json(in, &why);
    if (manifest.is_discarded() || !manifest.is_object()) {
      run.problem = manifest_path + ": not a lockstep manifest (" + (why.empty() ? "not an object" : why) + ")";
      return run;
    }
    const json metrics = manifest.value("metrics", json::object());
    if (metrics.is_object() && metrics.contains("final_param_digest") && metrics["final_param_digest"].is_string())
      run.final_digest = metrics["final_param_digest"].get<std::string>();
    if (metrics.is_object() && metrics.contains("steps") && metrics["steps"].is_number_integer())
      run.last_step = metrics["steps"].get<int64_t>();
  }
  const std::string audit_path = folder + "/audit-rank0.jsonl";
  if (!regular_file(audit_path)) return run;  // no audits (audit.every = 0): the digests still compare
  std::ifstream in(audit_path);
  std::string line;
  size_t number = 0;
  JsonLimits limits;
  while (number < kMaxAuditLines) {
    // A line longer than one document's bound is refused without reading it whole.
    line.clear();
    char c = 0;
    bool ended = false;
    while (in.get(c)) {
      if (c == '\n') {
        ended = true;
        break;
      }
      if (line.size() > limits.max_bytes) break;
      line.push_back(c);
    }
    if (line.empty() && !ended) break;
    ++number;
    if (line.empty()) continue;
    std::string why;
    const json audit = parse_untrusted_json(line, &why, limits);
    const bool shaped = !audit.is_discarded() && audit.is_object() && audit.contains("step") &&
                        audit["step"].is_number_integer() && audit.contains("tensors") &&
                        audit["tensors"].is_object();
    if (!shaped) {
      run.problem = audit_path + ":" + std::to_string(number) + ": not an audit line" +
                    (why.empty() ? std::string() : " (" + why + ")");
      return run;
    }
    if (audit.contains("digest") && audit["digest"].is_string()) run.digest_kind = audit["digest"].get<std::string>();
    run.audits[audit["step"].get<int64_t>()] = audit;
  }
  if (number >= kMaxAuditLines) run.problem = audit_path + ": more than " + std::to_string(kMaxAuditLines) + " lines";
  return run;
}

double number_or_nan(const json& object, const std::string& key) {
  if (!object.is_object() || !object.contains(key) || !object[key].is_number()) return std::nan("");
  return object[key].get<double>();
}

}  // namespace

RunComparison compare_runs(const std::string& run_a, const std::string& run_b) {
  RunComparison result;
  const RunEvidence a = read_run(run_a), b = read_run(run_b);
  for (const RunEvidence* run : {&a, &b})
    if (!run->problem.empty()) {
      result.exit_code = 2;
      result.text = "cannot compare: " + run->problem + "\n";
      result.json = {{"verdict", "unreadable"}, {"problem", run->problem}};
      return result;
    }
  result.json = {{"run_a", run_a}, {"run_b", run_b}, {"final_digest_a", a.final_digest},
                 {"final_digest_b", b.final_digest}};
  if (!a.final_digest.empty() && a.final_digest == b.final_digest) {
    result.json["verdict"] = "bit-identical";
    result.text = fmt::format("bit-identical: both runs end on parameter digest {}\n", a.final_digest);
    return result;
  }
  result.exit_code = 1;
  result.json["verdict"] = "different";
  std::string text;
  if (a.final_digest.empty() || b.final_digest.empty())
    text = "not comparable at the end: " + std::string(a.final_digest.empty() ? run_a : run_b) +
           " has no final parameter digest (it did not finish)\n";
  else
    text = fmt::format("different: final parameter digests {} and {}\n", a.final_digest, b.final_digest);
  if (!a.digest_kind.empty() && !b.digest_kind.empty() && a.digest_kind != b.digest_kind)
    text += fmt::format("note: the runs digest tensors differently ({} and {}): only the sums compare\n",
                        a.digest_kind, b.digest_kind);
  const bool digests_compare = a.digest_kind == b.digest_kind;
  // The first audited step both runs have whose evidence differs.
  for (const auto& [step, audit_a] : a.audits) {
    const auto found = b.audits.find(step);
    if (found == b.audits.end()) continue;
    const json& audit_b = found->second;
    std::vector<std::string> parted;
    std::string largest_name;
    double largest = -1, largest_relative = 0;
    const json sums_a = audit_a.value("sums", json::object()), sums_b = audit_b.value("sums", json::object());
    for (const auto& [name, digest] : audit_a["tensors"].items()) {
      if (!audit_b["tensors"].contains(name)) {
        parted.push_back(name + " (only in " + run_a + ")");
        continue;
      }
      const double sum_a = number_or_nan(sums_a, name), sum_b = number_or_nan(sums_b, name);
      const bool same = digests_compare ? audit_b["tensors"][name] == digest : sum_a == sum_b;
      if (same) continue;
      parted.push_back(name);
      const double difference = std::abs(sum_a - sum_b);
      if (std::isfinite(difference) && difference > largest) {
        largest = difference;
        largest_name = name;
        largest_relative = difference / std::max(std::abs(sum_a), std::abs(sum_b));
      }
    }
    if (parted.empty()) continue;
    std::string names;
    for (size_t i = 0; i < parted.size() && i < 8; ++i) names += (i ? ", " : "") + parted[i];
    if (parted.size() > 8) names += fmt::format(" and {} more", parted.size() - 8);
    text += fmt::format("first parted at step {} (the first audited step whose evidence differs): {} of {} "
                        "tensors differ: {}\n", step, parted.size(), audit_a["tensors"].size(), names);
    json first = {{"step", step}, {"tensors", parted}};
    if (largest >= 0) {
      text += fmt::format("largest difference there: the sum of {} differs by {:.6g} ({:.3g} of its size)\n",
                          largest_name, largest, largest_relative);
      first["largest_sum_difference"] = {{"tensor", largest_name}, {"difference", largest},
                                         {"relative", largest_relative}};
    }
    result.json["first_parted"] = first;
    result.text = text;
    return result;
  }
  if (a.audits.empty() || b.audits.empty())
    text += "no audit evidence to say where they parted (audit.every = 0 in " +
            std::string(a.audits.empty() ? run_a : run_b) + ")\n";
  else
    text += "every audited step both runs have agrees: they parted after the last audited one\n";
  result.text = text;
  return result;
}

}  // namespace lockstep

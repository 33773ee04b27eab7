// The rank-drift audit end to end: real ranks, a fault injected on one of
// them, the in-run alarm, the three policies, and `lockstep audit` reading
// the evidence afterwards.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include <gtest/gtest.h>

#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

namespace fs = std::filesystem;

struct AuditedRun {
  CommandResult run;
  std::string folder;
  std::vector<nlohmann::json> coordinator_audits;  // audit.jsonl
  CommandResult offline;                           // lockstep audit --json
  nlohmann::json offline_json;
};

AuditedRun audited_run(const TempDir& dir, const std::vector<std::string>& sets) {
  std::vector<std::string> all = {"job.steps=20", "audit.every=5"};
  all.insert(all.end(), sets.begin(), sets.end());
  AuditedRun r;
  r.run = run_lockstep(synthetic_run(dir, 2, all), dir.path(), 120);
  r.folder = single_run(dir.path() + "/runs");
  if (fs::exists(r.folder + "/audit.jsonl")) r.coordinator_audits = read_json_lines(r.folder + "/audit.jsonl");
  r.offline = run_lockstep({"audit", r.folder, "--json"}, dir.path(), 30);
  r.offline_json = nlohmann::json::parse(r.offline.output, nullptr, false);
  return r;
}

const nlohmann::json* audit_at(const AuditedRun& r, int64_t step) {
  for (const auto& a : r.coordinator_audits)
    if (a["step"] == step) return &a;
  return nullptr;
}

TEST(Audit, CleanRunAgreesEverywhere) {
  TempDir dir;
  AuditedRun r = audited_run(dir, {});
  ASSERT_EQ(r.run.exit_code, 0) << r.run.output;
  auto manifest = read_json(r.folder + "/manifest.json");
  EXPECT_EQ(manifest["metrics"]["audits"], 5);  // steps 1, 5, 10, 15, 20
  EXPECT_EQ(manifest["metrics"]["audits_disagreeing"], 0);
  ASSERT_EQ(r.coordinator_audits.size(), 5u);
  for (const auto& a : r.coordinator_audits) EXPECT_EQ(a["agreed"], true) << a.dump();
  EXPECT_EQ(r.offline.exit_code, 0) << r.offline.output;
  EXPECT_EQ(r.offline_json["verdict"], "agreed");
  auto text = run_lockstep({"audit", r.folder}, dir.path(), 30);
  EXPECT_NE(text.output.find("all 2 ranks agreed at every one of 5 audited steps"), std::string::npos)
      << text.output;
}

// |sum of fc2.bias on rank 1 - on rank 0| at `step`, from the ranks' own evidence:
// with one element perturbed, that is what the perturbation grew to.
double evidence_difference(const std::string& folder, int64_t step) {
  double sums[2] = {0, 0};
  for (int rank = 0; rank < 2; ++rank)
    for (const auto& e : read_json_lines(folder + "/audit-rank" + std::to_string(rank) + ".jsonl"))
      if (e["step"] == step) sums[rank] = e["sums"]["fc2.bias"];
  return std::abs(sums[1] - sums[0]);
}

const std::string kPerturb = "fault.inject=perturb:fc2.bias:1:7:1e-7";

TEST(Audit, PerturbationIsNamedAtTheNextAuditAndWarnGoesOn) {
  TempDir dir;
  AuditedRun r = audited_run(dir, {kPerturb, "audit.policy=warn"});
  // Warn keeps training but does not report success: its own outcome and exit status.
  ASSERT_EQ(r.run.exit_code, 3) << r.run.output;
  auto manifest = read_json(r.folder + "/manifest.json");
  EXPECT_EQ(manifest["status"], "completed_with_drift") << manifest.dump(2);
  EXPECT_EQ(manifest["first_drift_step"], 10);
  std::string last_line = r.run.output.substr(0, r.run.output.find_last_not_of('\n') + 1);
  last_line = last_line.substr(last_line.rfind('\n') + 1);
  EXPECT_NE(last_line.find("completed_with_drift: the ranks disagreed at"), std::string::npos) << last_line;
  EXPECT_NE(last_line.find("first at step 10"), std::string::npos) << last_line;
  EXPECT_EQ(r.offline_json["run_status"], "completed_with_drift") << r.offline.output;
  auto text = run_lockstep({"audit", r.folder}, dir.path(), 30);
  EXPECT_NE(text.output.find("run outcome (manifest.json): completed_with_drift"), std::string::npos)
      << text.output;
  const auto* at5 = audit_at(r, 5);
  const auto* at10 = audit_at(r, 10);
  ASSERT_TRUE(at5 && at10) << r.run.output;
  EXPECT_EQ((*at5)["agreed"], true);
  EXPECT_EQ((*at10)["agreed"], false);
  ASSERT_EQ((*at10)["findings"].size(), 1u) << at10->dump();
  const auto& finding = (*at10)["findings"][0];
  EXPECT_EQ(finding["tensor"], "fc2.bias");
  EXPECT_EQ(finding["groups"], nlohmann::json::parse("[[0],[1]]"));
  const double reported = finding["max_abs_diff"][1];
  const double grown = evidence_difference(r.folder, 10);
  std::printf("perturbation 1e-7 at step 7: reported max|diff| %.3g at step 10, evidence %.3g\n",
              reported, grown);
  EXPECT_GT(grown, 0.0);
  EXPECT_LE(reported, 2 * grown);
  EXPECT_GE(reported, grown / 2);
  EXPECT_NE(r.run.output.find("parameter 'fc2.bias' differs across ranks: ranks {0} vs {1}"),
            std::string::npos) << r.run.output;

  EXPECT_EQ(r.offline.exit_code, 1) << r.offline.output;
  EXPECT_EQ(r.offline_json["first_drift_step"], 10);
  EXPECT_EQ(r.offline_json["first_drift_tensors"], nlohmann::json::parse("[\"fc2.bias\"]"));
  EXPECT_TRUE(r.offline_json["agreed_again_step"].is_null());
}

TEST(Audit, PolicyFailStopsTheJob) {
  TempDir dir;
  AuditedRun r = audited_run(dir, {kPerturb, "audit.policy=fail"});
  EXPECT_EQ(r.run.exit_code, 1) << r.run.output;
  EXPECT_NE(r.run.output.find("audit.policy = fail stops the job"), std::string::npos);
  auto manifest = read_json(r.folder + "/manifest.json");
  EXPECT_EQ(manifest["status"], "failed");
  EXPECT_NE(manifest["error"].get<std::string>().find("fc2.bias"), std::string::npos);
}

TEST(Audit, PolicyResyncMakesTheNextAuditAgree) {
  TempDir dir;
  AuditedRun r = audited_run(dir, {kPerturb, "audit.policy=resync"});
  ASSERT_EQ(r.run.exit_code, 3) << "repaired drift is still drift: " << r.run.output;
  ASSERT_TRUE(audit_at(r, 10) && audit_at(r, 15));
  EXPECT_EQ((*audit_at(r, 10))["action"], "resynced");
  EXPECT_EQ((*audit_at(r, 15))["agreed"], true);
  EXPECT_EQ(r.offline.exit_code, 1);
  EXPECT_EQ(r.offline_json["first_drift_step"], 10);
  EXPECT_EQ(r.offline_json["agreed_again_step"], 15);
}

TEST(Audit, SharedStorageDoubleScaleOnOneRankIsCaught) {
  TempDir dir;
  AuditedRun r = audited_run(dir, {"fault.inject=double_scale:fc2.bias:1:3"});
  ASSERT_EQ(r.run.exit_code, 3) << r.run.output;
  ASSERT_TRUE(audit_at(r, 1) && audit_at(r, 5));
  EXPECT_EQ((*audit_at(r, 1))["agreed"], true);
  EXPECT_EQ((*audit_at(r, 5))["agreed"], false);
  EXPECT_EQ((*audit_at(r, 5))["findings"][0]["tensor"], "fc2.bias");
  EXPECT_EQ(r.offline_json["first_drift_step"], 5);
}

TEST(Audit, EqualRandomStreamsAreReported) {
  TempDir dir;
  AuditedRun r = audited_run(dir, {"test.no_reseed=true"});
  ASSERT_EQ(r.run.exit_code, 0) << r.run.output;
  ASSERT_FALSE(r.coordinator_audits.empty());
  for (const auto& a : r.coordinator_audits) EXPECT_EQ(a["streams_distinct"], false);
  EXPECT_EQ(r.offline_json["streams_shared"], true);
  EXPECT_NE(r.run.output.find("same random generator state"), std::string::npos);
}

TEST(Audit, MissingOrTruncatedEvidenceIsNamed) {
  TempDir dir;
  AuditedRun r = audited_run(dir, {});
  ASSERT_EQ(r.run.exit_code, 0);
  const std::string rank1 = r.folder + "/audit-rank1.jsonl";
  fs::resize_file(rank1, fs::file_size(rank1) - 40);  // cut the last line
  auto truncated = run_lockstep({"audit", r.folder}, dir.path(), 30);
  EXPECT_EQ(truncated.exit_code, 2) << truncated.output;
  EXPECT_NE(truncated.output.find("audit-rank1.jsonl:5: truncated or corrupt line"),
            std::string::npos) << truncated.output;
  fs::remove(r.folder + "/audit-rank0.jsonl");
  auto missing = run_lockstep({"audit", r.folder}, dir.path(), 30);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("audit-rank0.jsonl: missing"), std::string::npos) << missing.output;
  auto nothing = run_lockstep({"audit", dir.path() + "/no-such-run"}, dir.path(), 30);
  EXPECT_EQ(nothing.exit_code, 2);
  EXPECT_NE(nothing.output.find("manifest.json: missing"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::testing

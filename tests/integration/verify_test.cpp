// Checking the arithmetic end to end: real ranks, a bit flipped in one
// rank's gradient (fault bitflip_grad), the cross-check that names it, the
// policies, the arithmetic probe at start, and `lockstep verify` replaying
// a run's steps on one rank against its step evidence, clean, altered,
// recorded by a corrupted rank, hostile.
#include <filesystem>
#include <fstream>
#include <regex>

#include <gtest/gtest.h>

#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

namespace fs = std::filesystem;

struct Run {
  CommandResult run;
  std::string folder;
};

Run run_job(const TempDir& dir, int nproc, std::vector<std::string> sets) {
  sets.insert(sets.begin(), "job.threads_per_rank=1");
  Run r;
  r.run = run_lockstep(synthetic_run(dir, nproc, sets), dir.path(), 150);
  r.folder = single_run(dir.path() + "/runs");
  return r;
}

CommandResult verify(const std::string& folder, std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"verify", folder};
  args.insert(args.end(), more.begin(), more.end());
  return run_lockstep(args, fs::path(folder).parent_path().string(), 120);
}

// Every step-evidence file of a run folder.
std::vector<std::string> evidence_files(const std::string& folder) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(folder))
    if (e.path().filename().string().rfind("step-evidence-", 0) == 0) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The first hex digit of `key`'s digest in a line of evidence, changed.
std::string altered(std::string line, const std::string& key) {
  const std::string marker = "\"" + key + "\":\"";
  const size_t at = line.find(marker);
  if (at == std::string::npos) return line;
  char& digit = line[at + marker.size()];
  digit = digit == '0' ? '1' : '0';
  return line;
}

void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : lines) out << l << "\n";
}

TEST(CrossCheck, ABitFlippedOnOneRankFailsTheJobAtTheFirstCheckNamingRankHostAndTensor) {
  TempDir dir;
  auto r = run_job(dir, 2, {"audit.verify_every=5", "fault.inject=bitflip_grad:fc1.weight:1:10"});
  EXPECT_EQ(r.run.exit_code, 1) << r.run.output;
  const std::string& out = r.run.output;
  EXPECT_NE(out.find("lowest mantissa bit of element 0 of the gradient of fc1.weight flipped on rank 1 in step 10"),
            std::string::npos) << out;
  // Caught at step 10 (the first check that covers it), named: the
  // microbatch, owner and checker with their hosts, the tensor, by how much.
  const std::regex named("MISCOMPUTE at step 10, microbatch 1: rank 1 \\([^)]+\\) computed it, rank 0 \\([^)]+\\) "
                         "computed it again and got other bits; gradients that differ: fc1.weight: 1 of 200704 "
                         "elements differ, max \\|diff\\| [0-9.e-]+ at element 0");
  EXPECT_TRUE(std::regex_search(out, named)) << out;
  EXPECT_NE(out.find("audit.on_miscompute = fail: the job stops before the step is applied"), std::string::npos);
  auto manifest = read_json(r.folder + "/manifest.json");
  EXPECT_EQ(manifest["status"], "failed");
  // Steps 1..9 were checked at 5 and applied; step 10 was not.
  int64_t last = 0;
  for (const auto& e : read_json_lines(evidence_files(r.folder).front()))
    last = std::max<int64_t>(last, e.value("step", int64_t(0)));
  EXPECT_EQ(last, 9);
  int agreed = 0;
  for (const auto& e : read_json_lines(r.folder + "/events-rank0.jsonl"))
    if (e.value("event", "") == "cross_check" && e.value("agreed", false)) ++agreed;
  EXPECT_EQ(agreed, 1);  // step 5
}

TEST(CrossCheck, ACleanRunChecksEveryRankAndItsReplayOnOneRankMatchesEveryDigest) {
  TempDir dir;
  auto r = run_job(dir, 2, {"audit.verify_every=1", "job.steps=30", "data.global_batch=128", "data.microbatch=32"});
  ASSERT_EQ(r.run.exit_code, 0) << r.run.output;
  // Every step, each rank recomputed a microbatch of the other, both of its
  // two in turn.
  std::set<int64_t> recomputed;
  for (const auto& e : read_json_lines(r.folder + "/events-rank0.jsonl"))
    if (e.value("event", "") == "cross_check") {
      EXPECT_TRUE(e["agreed"].get<bool>());
      recomputed.insert(e["recomputed_microbatch"].get<int64_t>());
    }
  EXPECT_EQ(recomputed, (std::set<int64_t>{2, 3}));
  auto manifest = read_json(r.folder + "/manifest.json");
  EXPECT_EQ(manifest["metrics"]["cross_checks"], 30);
  EXPECT_EQ(manifest["metrics"]["miscomputes"], 0);
  EXPECT_EQ(manifest["checks"]["arithmetic_probe"], "agreed");

  auto v = verify(r.folder);
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find("VERIFIED steps 1 to 30: 30 steps, 120 microbatch digests and 3 state digests"),
            std::string::npos) << v.output;
  auto json = verify(r.folder, {"--json", "--steps", "11:20"});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  auto parsed = nlohmann::json::parse(json.output.substr(json.output.find('{')));
  EXPECT_TRUE(parsed["verified"].get<bool>());
  EXPECT_EQ(parsed["steps_checked"], 10);
  EXPECT_EQ(parsed["microbatch_digests_checked"], 40);
  EXPECT_GT(parsed["seconds"].get<double>(), 0.0);
  // Nothing was written into the run.
  EXPECT_FALSE(fs::exists(r.folder + "/runs"));
}

TEST(CrossCheck, AlteredEvidenceIsNamedByStepMicrobatchAndRank) {
  TempDir dir;
  auto r = run_job(dir, 2, {"audit.verify_every=0", "job.steps=20"});
  ASSERT_EQ(r.run.exit_code, 0) << r.run.output;
  EXPECT_NE(r.run.output.find("Decision: audit.verify_every = off"), std::string::npos);
  const std::string file = evidence_files(r.folder).back();  // rank 1's
  auto lines = lines_of(file);
  ASSERT_GE(lines.size(), 20u);
  lines[6] = altered(lines[6], "grad");  // a hex digit of step 7's microbatch digest
  write_lines(file, lines);
  auto v = verify(r.folder);
  EXPECT_EQ(v.exit_code, 1) << v.output;
  EXPECT_NE(v.output.find("DIFFERS at step 7, microbatch 1: rank 1"), std::string::npos) << v.output;
  EXPECT_NE(v.output.find("6 step(s) before it matched"), std::string::npos) << v.output;
  // The state after a step (rank 0 keeps it every audit.every = 10 steps), altered at step 10.
  const std::string first = evidence_files(r.folder).front();
  auto zero = lines_of(first);
  ASSERT_NE(zero[9].find("\"parameters\""), std::string::npos) << zero[9];
  EXPECT_EQ(zero[10].find("\"parameters\""), std::string::npos) << zero[10];
  zero[9] = altered(zero[9], "parameters");
  write_lines(first, zero);
  auto states = verify(r.folder, {"--steps", "8:20"});
  EXPECT_EQ(states.exit_code, 1) << states.output;
  EXPECT_NE(states.output.find("DIFFERS at step 10: the parameters after it differ: rank 0"),
            std::string::npos) << states.output;
}

TEST(CrossCheck, ARunRecordedByACorruptedRankUnderWarnIsNamedByVerify) {
  TempDir dir;
  auto r = run_job(dir, 2, {"audit.verify_every=4", "audit.on_miscompute=warn", "job.steps=20",
                            "fault.inject=bitflip_grad:fc2.bias:1:12"});
  ASSERT_EQ(r.run.exit_code, 0) << r.run.output;
  EXPECT_NE(r.run.output.find("MISCOMPUTE at step 12, microbatch 1: rank 1"), std::string::npos) << r.run.output;
  EXPECT_NE(r.run.output.find("audit.on_miscompute = warn: the step goes on"), std::string::npos);
  auto manifest = read_json(r.folder + "/manifest.json");
  EXPECT_EQ(manifest["metrics"]["miscomputes"], 1);
  auto v = verify(r.folder);
  EXPECT_EQ(v.exit_code, 1) << v.output;
  EXPECT_NE(v.output.find("DIFFERS at step 12, microbatch 1: rank 1"), std::string::npos) << v.output;
  EXPECT_NE(v.output.find("the loss sum agrees: the gradient differs"), std::string::npos) << v.output;
  // Steps before it verify.
  auto before = verify(r.folder, {"--steps", "1:11"});
  EXPECT_EQ(before.exit_code, 0) << before.output;
}

TEST(CrossCheck, AFourRankRunIsVerifiedOnOneRankFromItsCheckpoints) {
  TempDir dir;
  auto r = run_job(dir, 4, {"job.steps=40", "checkpoint.every=10", "checkpoint.keep=10", "audit.verify_every=10"});
  ASSERT_EQ(r.run.exit_code, 0) << r.run.output;
  auto v = verify(r.folder);
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find("recorded by 4 rank(s)"), std::string::npos) << v.output;
  EXPECT_NE(v.output.find("VERIFIED steps 1 to 40: 40 steps, 160 microbatch digests"), std::string::npos) << v.output;
  auto later = verify(r.folder, {"--steps", "25:40"});
  EXPECT_EQ(later.exit_code, 0) << later.output;
  EXPECT_NE(later.output.find("from the checkpoint of step 20"), std::string::npos) << later.output;
  EXPECT_NE(later.output.find("VERIFIED steps 25 to 40: 16 steps"), std::string::npos) << later.output;
  // A rank's evidence file gone: those microbatches cannot be verified.
  fs::remove(evidence_files(r.folder)[2]);
  auto missing = verify(r.folder);
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find("no evidence for step 1, microbatch 2"), std::string::npos) << missing.output;
}

TEST(ArithmeticProbe, ARankThatComputesTheFixedWorkloadWrongIsRefusedBeforeTraining) {
  TempDir dir;
  auto r = run_job(dir, 2, {"test.probe_fault_rank=1"});
  EXPECT_EQ(r.run.exit_code, 1) << r.run.output;
  const std::regex named("arithmetic probe: rank 1 \\([^)]+\\): element \\(0, 7\\) of a 96x80 by 80x64 integer "
                         "matrix product is [-0-9.e]+, not -?[0-9]+");
  EXPECT_TRUE(std::regex_search(r.run.output, named)) << r.run.output;
  EXPECT_NE(r.run.output.find("refused before training"), std::string::npos);
  EXPECT_EQ(r.run.output.find("step 1/"), std::string::npos) << "trained a step";
  EXPECT_EQ(read_json(r.folder + "/manifest.json")["status"], "failed");
}

TEST(CrossCheck, BadRequestsAreRefusedAsBadInput) {
  TempDir dir;
  // exclude needs an elastic job.
  auto exclude = run_lockstep(synthetic_run(dir, 2, {"audit.on_miscompute=exclude"}), dir.path(), 60);
  EXPECT_EQ(exclude.exit_code, 2) << exclude.output;
  EXPECT_NE(exclude.output.find("audit.on_miscompute = exclude drops the host"), std::string::npos) << exclude.output;
  auto policy = run_lockstep(synthetic_run(dir, 2, {"audit.on_miscompute=ignore"}), dir.path(), 60);
  EXPECT_EQ(policy.exit_code, 2) << policy.output;
  auto fault = run_lockstep(synthetic_run(dir, 2, {"fault.inject=bitflip_grad:fc1.weight:1"}), dir.path(), 60);
  EXPECT_EQ(fault.exit_code, 2) << fault.output;
  EXPECT_NE(fault.output.find("bitflip_grad:TENSOR:RANK:STEP"), std::string::npos) << fault.output;

  auto r = run_job(dir, 2, {"job.steps=10", "comm.summation=float"});
  ASSERT_EQ(r.run.exit_code, 0) << r.run.output;
  auto floats = verify(r.folder);
  EXPECT_EQ(floats.exit_code, 2) << floats.output;
  EXPECT_NE(floats.output.find("comm.summation = float"), std::string::npos) << floats.output;
  for (const auto& steps : {"5", "9:3", "0:4", "x:y", "50:60"}) {
    auto bad = verify(r.folder, {"--steps", steps});
    EXPECT_EQ(bad.exit_code, 2) << steps << ": " << bad.output;
  }
  auto nothing = verify(dir.path());
  EXPECT_EQ(nothing.exit_code, 2) << nothing.output;
}

// The evidence is read, never trusted: each hostile file is bad input
// naming the file and line, never a crash or a hang.
TEST(StepEvidenceInput, HostileStepEvidenceIsBadInputNamingFileAndLine) {
  TempDir dir;
  auto r = run_job(dir, 2, {"job.steps=6"});
  ASSERT_EQ(r.run.exit_code, 0) << r.run.output;
  const std::string file = evidence_files(r.folder).front();
  const auto original = lines_of(file);
  const std::vector<std::pair<std::string, std::string>> hostile = {
      {std::string(2u << 20, 'x'), "longer than"},
      {"{\"event\":\"step_evidence\",\"step\":", "truncated or corrupt"},
      {std::string(5000, '[') + std::string(5000, ']'), "truncated or corrupt"},
      {R"({"event":"step_evidence","step":-3,"rank":0,"world_size":2,"generation":1,"after_checkpoint":0,"microbatches":[]})", "'step' must be"},
      {R"({"event":"step_evidence","step":2,"rank":5,"world_size":2,"generation":1,"after_checkpoint":0,"microbatches":[]})", "rank is not below"},
      {R"({"event":"step_evidence","step":2,"rank":0,"world_size":2,"generation":1,"after_checkpoint":0,"microbatches":[{"index":0,"grad":"ZZ"}]})", "lowercase hex"},
      {R"({"event":"step_evidence","step":2,"rank":0,"world_size":2,"generation":1,"after_checkpoint":0,"microbatches":"all"})", "'microbatches' must be"},
  };
  for (const auto& [line, said] : hostile) {
    auto lines = original;
    lines.insert(lines.begin() + 2, line);
    write_lines(file, lines);
    auto v = verify(r.folder);
    EXPECT_EQ(v.exit_code, 2) << said << ": " << v.output.substr(0, 2000);
    EXPECT_NE(v.output.find(file + ":3"), std::string::npos) << said << ": " << v.output.substr(0, 2000);
    EXPECT_NE(v.output.find(said), std::string::npos) << v.output.substr(0, 2000);
  }
}

}  // namespace
}  // namespace lockstep::testing

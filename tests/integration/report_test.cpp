// lockstep report on real runs (clean, drifted, restarted, failed, killed
// mid-run; 100,000 steps in report_size_test.cpp), each page opened in headless Chromium inside a
// network namespace of its own (tests/python/browse_report.py): no console
// message, no request leaving the file, the drift and the restart in the
// page's text, a screenshot in build/tests/report-screenshots/.
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <gtest/gtest.h>

#include "integration/browser.h"
#include "integration/jobs.h"
#include "support/cli_runner.h"

using namespace lockstep::testing;

namespace {

namespace fs = std::filesystem;

// The report of `run` opened in the browser, checked for what no report may do.
nlohmann::json open_report(const std::string& run, const std::string& name) {
  auto made = run_lockstep({"report", run}, run, 60);
  EXPECT_EQ(made.exit_code, 0) << made.output;
  const std::string html = run + "/report.html";
  EXPECT_TRUE(fs::exists(html)) << made.output;
  const std::string shot = screenshot_path(name);
  auto seen = browse(html, shot);
  EXPECT_EQ(seen["console"].size(), 0u) << seen["console"].dump(1);
  EXPECT_EQ(seen["page_requests"].size(), 0u) << seen["page_requests"].dump(1);
  EXPECT_TRUE(fs::exists(shot) && fs::file_size(shot) > 10000) << shot;
  std::cout << name << ": " << fs::file_size(html) << " bytes, screenshot " << shot << ", opened in "
            << seen["load_s"] << " s (an empty page " << seen["blank_s"] << " s)" << std::endl;
  return seen;
}

bool has(const nlohmann::json& seen, const std::string& text) {
  return seen.value("text", std::string()).find(text) != std::string::npos;
}

std::string text_of(const nlohmann::json& seen) { return seen.value("text", std::string()).substr(0, 6000); }

}  // namespace

TEST(Report, TheBrowserCheckSeesAConsoleErrorAndARequest) {
  if (chromium_missing()) GTEST_SKIP() << "chromium is not installed (deploy/install-deps.sh installs it)";
  // The check itself, on a page that does both: otherwise a silent checker
  // would pass every report.
  TempDir dir;
  const std::string page = dir.path() + "/bad.html";
  std::ofstream(page) << "<!DOCTYPE html><html><body><script>console.error('deliberate')</script>"
                         "<img src=\"http://report-asset.invalid/x.png\"></body></html>";
  auto seen = browse(page);
  EXPECT_EQ(seen["console"].size(), 1u) << seen.dump(1);
  ASSERT_EQ(seen["page_requests"].size(), 1u) << seen.dump(1);
  EXPECT_NE(seen["page_requests"][0].get<std::string>().find("report-asset.invalid"), std::string::npos);
}

TEST(Report, CleanDriftedAndRestartedRunsOpenWithoutErrorsAndShowWhatHappened) {
  if (chromium_missing()) GTEST_SKIP() << "chromium is not installed (deploy/install-deps.sh installs it)";
  TempDir clean_dir, drift_dir, restart_dir;
  const std::vector<std::string> common = {"job.steps=30", "job.log_every=5"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), common.begin(), common.end());
    return extra;
  };
  auto clean = run_lockstep(synthetic_run(clean_dir, 2, with({})), clean_dir.path(), 150);
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  auto drifted = run_lockstep(synthetic_run(drift_dir, 2, with({"fault.inject=perturb:fc2.bias:1:15:1e-3"})),
                              drift_dir.path(), 150);
  ASSERT_EQ(drifted.exit_code, 3) << drifted.output;
  auto restarted = run_lockstep(
      synthetic_run(restart_dir, 2,
                    with({"checkpoint.every=5", "fault.heartbeat_timeout_s=5", "fault.max_restarts=1",
                          "test.fail_rank=1", "test.fail_step=12", "test.fail_kind=kill"})),
      restart_dir.path(), 170);
  ASSERT_EQ(restarted.exit_code, 0) << restarted.output;
  const std::string clean_run = single_run(clean_dir.path() + "/runs");
  const std::string drift_run = single_run(drift_dir.path() + "/runs");
  const std::string restart_run = single_run(restart_dir.path() + "/runs");

  auto seen = open_report(clean_run, "clean");
  EXPECT_TRUE(has(seen, "completed all 30 steps")) << text_of(seen);
  EXPECT_TRUE(has(seen, "The ranks agreed at all")) << text_of(seen);
  EXPECT_TRUE(has(seen, "forward_backward")) << text_of(seen);  // the phase chart's legend
  EXPECT_TRUE(has(seen, "Decision")) << text_of(seen);
  EXPECT_TRUE(has(seen, "No restart.")) << text_of(seen);

  seen = open_report(drift_run, "drifted");
  EXPECT_TRUE(has(seen, "completed_with_drift")) << text_of(seen);
  EXPECT_TRUE(has(seen, "First drift at step 20: DRIFT: fc2.bias ranks {0} vs {1}")) << text_of(seen);
  EXPECT_TRUE(has(seen, "first drift: step 20")) << text_of(seen);  // marked on the curves

  seen = open_report(restart_run, "restarted");
  EXPECT_TRUE(has(seen, "restart: generation 2, resumed from step 10")) << text_of(seen);
  EXPECT_TRUE(has(seen, "was killed by signal 9")) << text_of(seen);
  auto manifest = read_json(restart_run + "/manifest.json");
  ASSERT_EQ(manifest["restarts"].size(), 1u) << manifest.dump(1);
  char recovery[32];
  std::snprintf(recovery, sizeof recovery, "%.2f s", manifest["restarts"][0]["recovery_s"].get<double>());
  EXPECT_TRUE(has(seen, recovery)) << recovery << "\n" << text_of(seen);

  // Two runs: overlaid, and the settings that differ listed with both values.
  const std::string both = clean_dir.path() + "/both.html";
  auto made = run_lockstep({"report", clean_run, drift_run, "-o", both}, clean_dir.path(), 60);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  seen = browse(both, screenshot_path("two-runs"));
  EXPECT_EQ(seen["console"].size(), 0u) << seen["console"].dump(1);
  EXPECT_EQ(seen["page_requests"].size(), 0u) << seen["page_requests"].dump(1);
  const std::string text = seen.value("text", std::string());
  const size_t differ = text.find("Settings that differ");
  ASSERT_NE(differ, std::string::npos) << text_of(seen);
  const std::string differing = text.substr(differ, text.find("All settings of") - differ);
  EXPECT_NE(differing.find("fault.inject"), std::string::npos) << differing;
  EXPECT_NE(differing.find("perturb:fc2.bias:1:15:1e-3"), std::string::npos) << differing;
  EXPECT_NE(differing.find("job.run_dir"), std::string::npos) << differing;
  EXPECT_EQ(differing.find("optim.lr"), std::string::npos) << differing;  // the same in both
  EXPECT_TRUE(has(seen, "A: " + fs::path(clean_run).filename().string())) << text_of(seen);
  EXPECT_TRUE(has(seen, "B: " + fs::path(drift_run).filename().string())) << text_of(seen);
}

TEST(Report, AFailedAndAKilledRunSayHowFarTheyGotAndWhy) {
  if (chromium_missing()) GTEST_SKIP() << "chromium is not installed (deploy/install-deps.sh installs it)";
  TempDir failed_dir, killed_dir;
  auto failed = run_lockstep(synthetic_run(failed_dir, 2, {"job.steps=30", "job.log_every=2", "fault.max_restarts=0", "test.fail_rank=1",
                                                           "test.fail_step=12", "test.fail_kind=exit"}),
                             failed_dir.path(), 150);
  ASSERT_EQ(failed.exit_code, 1) << failed.output;
  auto seen = open_report(single_run(failed_dir.path() + "/runs"), "failed");
  EXPECT_TRUE(has(seen, "failed at step")) << text_of(seen);
  EXPECT_TRUE(has(seen, "rank 1")) << text_of(seen);

  // Killed with its whole process group mid-run: nobody writes the end.
  LockstepProcess run(synthetic_run(killed_dir, 2, {"job.steps=100000", "job.log_every=10", "audit.every=0"}),
                      killed_dir.path());
  ASSERT_TRUE(run.wait_for_output("step 200/100000", 90)) << run.output();
  run.kill_group();
  run.wait(10);
  const std::string killed = single_run(killed_dir.path() + "/runs");
  seen = open_report(killed, "killed");
  EXPECT_TRUE(has(seen, "the manifest still says running")) << text_of(seen);
  EXPECT_TRUE(has(seen, "of 100000")) << text_of(seen);  // how far, out of how many
}

TEST(Report, CsvHoldsEveryStepEventOfEveryRank) {
  TempDir dir;
  auto result = run_lockstep(synthetic_run(dir, 2, {"job.steps=20", "job.log_every=2"}), dir.path(), 150);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string run = single_run(dir.path() + "/runs");
  auto made = run_lockstep({"report", "--csv", run, "-o", "-"}, dir.path(), 60);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  std::istringstream lines(made.output);
  std::string header, line;
  std::getline(lines, header);
  ASSERT_EQ(header.rfind("kind,run,rank,generation,step,time,loss,lr,samples_per_s,", 0), 0u) << header;
  std::map<std::pair<int, int64_t>, double> loss;  // (rank, step) -> loss
  int eval_rows = 0;
  while (std::getline(lines, line)) {
    std::vector<std::string> fields;
    std::stringstream split(line);
    for (std::string field; std::getline(split, field, ',');) fields.push_back(field);
    if (line.rfind("eval,", 0) == 0) ++eval_rows;
    if (line.rfind("step,", 0) != 0) continue;
    loss[{std::stoi(fields[2]), std::stoll(fields[4])}] = std::stod(fields[6]);
  }
  EXPECT_EQ(eval_rows, 2);  // the final test evaluation, each rank
  size_t events = 0;
  for (int rank = 0; rank < 2; ++rank)
    for (const auto& e : read_json_lines(run + "/events-rank" + std::to_string(rank) + ".jsonl")) {
      if (e["event"] != "step") continue;
      ++events;
      auto it = loss.find({rank, e["step"].get<int64_t>()});
      ASSERT_NE(it, loss.end()) << e.dump();
      EXPECT_NEAR(it->second, e["loss"].get<double>(), 1e-7 * std::abs(e["loss"].get<double>()));
    }
  EXPECT_EQ(events, 20u);
  EXPECT_EQ(loss.size(), events);
}

TEST(Report, WhatIsNotARunFolderIsBadInput) {
  TempDir dir;
  auto missing = run_lockstep({"report", dir.path() + "/nowhere"}, dir.path(), 30);
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find(dir.path() + "/nowhere: no such folder"), std::string::npos) << missing.output;
  auto empty = run_lockstep({"report", dir.path()}, dir.path(), 30);
  EXPECT_EQ(empty.exit_code, 2) << empty.output;
  EXPECT_NE(empty.output.find("not a run folder"), std::string::npos) << empty.output;
  EXPECT_FALSE(fs::exists(dir.path() + "/report.html"));
  std::vector<std::string> five = {"report"};
  for (int i = 0; i < 5; ++i) five.push_back(dir.path());
  auto many = run_lockstep(five, dir.path(), 30);
  EXPECT_EQ(many.exit_code, 2) << many.output;
  EXPECT_NE(many.output.find("at most 4"), std::string::npos) << many.output;
}

namespace {

// A copy of the run folder `from` (without checkpoints) as `to`.
std::string copy_run(const std::string& from, const std::string& to) {
  fs::copy(from, to, fs::copy_options::recursive);
  fs::remove_all(to + "/checkpoints");
  return to;
}

void edit_json(const std::string& file, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json value = read_json(file);
  edit(value);
  std::ofstream(file) << value.dump();
}

}  // namespace

TEST(Report, HostileRunFoldersAreNamedAndNeverCrashOrHang) {
  TempDir dir;
  auto made = run_lockstep(synthetic_run(dir, 2, {"job.steps=20", "eval.every=10"}), dir.path(), 120);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string run = single_run(dir.path() + "/runs");
  struct Case {
    std::string name;
    std::function<void(const std::string&)> make;
    int exit_code;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"world_size_1e9", [](const std::string& d) { edit_json(d + "/manifest.json", [](auto& m) { m["world_size"] = 1e9; }); },
       2, "world_size 1000000000.0 is not a whole number from 1 to 65536"},
      {"far_rank_file", [](const std::string& d) { std::ofstream(d + "/events-rank2147483646.jsonl"); }, 0,
       "rank 2147483646 is past the 65536 ranks a job can have; left out"},
      {"rank_past_int", [](const std::string& d) { std::ofstream(d + "/events-rank99999999999.jsonl"); }, 0,
       "rank 99999999999 is past the 65536 ranks"},
      {"wrong_types",
       [](const std::string& d) {
         edit_json(d + "/manifest.json", [](auto& m) { m["run_id"] = 42; });
         std::ofstream(d + "/events-rank0.jsonl", std::ios::app)
             << R"({"event":"audit_result","step":1e300,"agreed":"yes"})" << "\n";
       },
       0, "report: wrote"},
      {"deep_manifest",
       [](const std::string& d) {
         std::ofstream(d + "/manifest.json") << std::string(100, '[') << std::string(100, ']');
         fs::remove(d + "/events-rank0.jsonl");
         fs::remove(d + "/events-rank1.jsonl");
       },
       2, "manifest.json is unreadable (nested"},
      {"fifo_events",
       [](const std::string& d) {
         fs::remove(d + "/events-rank1.jsonl");
         ASSERT_EQ(::mkfifo((d + "/events-rank1.jsonl").c_str(), 0600), 0);
       },
       0, "events-rank1.jsonl: not a regular file; left out"},
      {"endless_audit",
       [](const std::string& d) {
         fs::remove(d + "/events-rank1.jsonl");
         fs::create_symlink("/dev/zero", d + "/events-rank1.jsonl");
         fs::remove(d + "/audit.jsonl");
       },
       0, "events-rank1.jsonl: not a regular file"},
  };
  for (const auto& c : cases) {
    const std::string copy = copy_run(run, dir.path() + "/" + c.name);
    c.make(copy);
    auto result = run_lockstep({"report", copy, "-o", copy + "/page.html"}, dir.path(), 30, {},
                               {"/usr/bin/time", "-f", "peak_rss_kib=%M"});
    EXPECT_EQ(result.exit_code, c.exit_code) << c.name << "\n" << result.output;
    EXPECT_LT(result.seconds, 10.0) << c.name;
    EXPECT_NE(result.output.find(c.needle), std::string::npos) << c.name << ": no '" << c.needle << "' in\n"
                                                              << result.output;
    EXPECT_EQ(result.output.find("json.exception"), std::string::npos) << c.name << ": a raw message\n" << result.output;
  }
}

TEST(Report, CsvQuotesMetricNamesThatHoldCommas) {
  TempDir dir;
  auto made = run_lockstep(synthetic_run(dir, 2, {"job.steps=20", "eval.every=10"}), dir.path(), 120);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string run = single_run(dir.path() + "/runs");
  const std::string events = run + "/events-rank0.jsonl";
  std::ofstream(events, std::ios::app)
      << R"({"event":"eval","step":20,"split":"test, held out","metrics":{"top,5 \"acc\"":0.5}})" << "\n";
  auto csv = run_lockstep({"report", run, "--csv", "-o", "-"}, dir.path(), 30);
  ASSERT_EQ(csv.exit_code, 0) << csv.output;
  EXPECT_NE(csv.output.find(R"(,"eval_top,5 ""acc""")"), std::string::npos) << csv.output.substr(0, 2000);
  EXPECT_NE(csv.output.find(R"(,"test, held out",)"), std::string::npos);
}

TEST(Report, EvaluationsCarryTheirSampleCountAndA95PercentInterval) {
  TempDir dir;
  auto made = run_lockstep(synthetic_run(dir, 2, {"job.steps=40", "eval.every=10"}), dir.path(), 120);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_NE(made.output.find("(n = 256, 95% intervals)"), std::string::npos) << made.output;
  const std::string run = single_run(dir.path() + "/runs");
  int evals = 0;
  for (const auto& e : read_json_lines(run + "/events-rank0.jsonl")) {
    if (e.value("event", "") != "eval") continue;
    ++evals;
    const auto& m = e["metrics"];
    const double n = m["targets"], p = m["accuracy"];
    EXPECT_EQ(n, 256);
    // Wilson's interval, recomputed here from the count of hits.
    const double z = 1.959963984540054, centre = (p + z * z / (2 * n)) / (1 + z * z / n);
    const double half = z * std::sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n);
    EXPECT_NEAR(m["accuracy_ci95_low"].get<double>(), centre - half, 1e-9) << m.dump();
    EXPECT_NEAR(m["accuracy_ci95_high"].get<double>(), centre + half, 1e-9) << m.dump();
    EXPECT_LT(m["loss_ci95_low"].get<double>(), m["loss"].get<double>());
    EXPECT_GT(m["loss_ci95_high"].get<double>(), m["loss"].get<double>());
  }
  EXPECT_EQ(evals, 4);
  auto report = run_lockstep({"report", run}, dir.path(), 60);
  ASSERT_EQ(report.exit_code, 0) << report.output;
  std::ifstream in(run + "/report.html");
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(html.find("at step 40: "), std::string::npos);
  EXPECT_NE(html.find(", 95% interval ["), std::string::npos);
  EXPECT_EQ(html.find("evaluation: test accuracy_ci95_low"), std::string::npos) << "a bound is not a chart of its own";
}

// The report of a 100,000-step run (a step event every 10 steps on the one
// rank, an audit every 1,000: one to two minutes of training on one
// thread, which leaves the other core to the tests beside it) stays under 5 MB
// and opens in Chromium in under 2 s beyond what an empty page takes:
// its curves are downsampled, and the page says so.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "integration/browser.h"
#include "integration/jobs.h"
#include "support/cli_runner.h"

using namespace lockstep::testing;

TEST(ReportSize, AHundredThousandStepRunStaysSmallAndOpensQuickly) {
  if (chromium_missing()) GTEST_SKIP() << "chromium is not installed (deploy/install-deps.sh installs it)";
  TempDir dir;
  auto run = run_lockstep(synthetic_run(dir, 1, {"job.steps=100000", "job.log_every=10", "data.batch_size=4",
                                                 "optim.lr=0.01", "audit.every=1000", "eval.every=20000",
                                                 "job.threads_per_rank=1"}),
                          dir.path(), 560);
  ASSERT_EQ(run.exit_code, 0) << run.output.substr(run.output.size() > 4000 ? run.output.size() - 4000 : 0);
  const std::string folder = single_run(dir.path() + "/runs");
  const auto events_bytes = std::filesystem::file_size(folder + "/events-rank0.jsonl");
  auto made = run_lockstep({"report", folder}, dir.path(), 60);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string html = folder + "/report.html";
  const auto bytes = std::filesystem::file_size(html);
  EXPECT_LT(bytes, 5u << 20);

  const std::string shot = screenshot_path("hundred-thousand-steps");
  auto seen = browse(html, shot, 3);
  EXPECT_EQ(seen["console"].size(), 0u) << seen["console"].dump(1);
  EXPECT_EQ(seen["page_requests"].size(), 0u) << seen["page_requests"].dump(1);
  const double extra = seen["load_s"].get<double>() - seen["blank_s"].get<double>();
  EXPECT_LT(extra, 2.0) << seen["loads_s"].dump();
  const std::string text = seen["text"];
  EXPECT_NE(text.find("downsampled: 10000 points per series shown as"), std::string::npos) << text.substr(0, 3000);
  EXPECT_NE(text.find("100000 of 100000"), std::string::npos) << text.substr(0, 3000);
  std::printf("100,000 steps: events %.1f MB, report %.2f MB (made in %.2f s), opened in %.2f s against %.2f s "
              "for an empty page (median of 3), screenshot %s\n",
              double(events_bytes) / 1e6, double(bytes) / 1e6, made.seconds, seen["load_s"].get<double>(),
              seen["blank_s"].get<double>(), shot.c_str());
  RecordProperty("report_bytes", std::to_string(bytes));
}

// TensorBoard event files written by real ranks, read back by an
// independent reader (tests/python/tb_reader.py: python3-protobuf with
// TensorBoard's field numbers, python3-crc32c): every scalar at the steps
// and with the values of the rank's JSON events; a drift shows as
// audit/agreed 0; a file cut mid-record keeps its complete records.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

namespace fs = std::filesystem;

nlohmann::json read_tensorboard(const std::string& file) {
  auto read = python_tool("tb_reader.py", file, 60);
  EXPECT_EQ(read.exit_code, 0) << "tb_reader.py " << file << "\n" << read.output;
  return nlohmann::json::parse(read.output);
}

std::string only_file(const std::string& folder) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(folder))
    if (entry.path().filename().string().find("tfevents") != std::string::npos) files.push_back(entry.path());
  EXPECT_EQ(files.size(), 1u) << folder;
  return files.empty() ? "" : files.front();
}

// (step, value) pairs of one tag.
std::map<int64_t, double> series(const nlohmann::json& read, const std::string& tag) {
  std::map<int64_t, double> out;
  if (read["scalars"].contains(tag))
    for (const auto& point : read["scalars"][tag]) out[point[0].get<int64_t>()] = point[1].get<double>();
  return out;
}

TEST(TensorBoard, EveryRanksScalarsMatchItsEventsAndADriftShows) {
  TempDir dir;
  auto args = synthetic_run(dir, 2, {"job.steps=30", "job.log_every=5", "eval.every=10", "audit.every=10",
                                     "fault.inject=perturb:fc2.bias:1:15:1e-3"});
  auto result = run_lockstep(args, dir.path(), 120);
  ASSERT_EQ(result.exit_code, 3) << "completed with drift\n" << result.output;
  const std::string run = single_run(dir.path() + "/runs");
  for (int rank : {0, 1}) {
    const auto read = read_tensorboard(only_file(run + "/tensorboard/rank" + std::to_string(rank)));
    EXPECT_EQ(read["file_version"], "brain.Event:2");
    EXPECT_EQ(read["incomplete_tail_bytes"], 0);
    std::map<int64_t, double> loss, lr, accuracy, agreed;
    for (const auto& e : read_json_lines(run + "/events-rank" + std::to_string(rank) + ".jsonl")) {
      if (e["event"] == "step") {
        loss[e["step"]] = e["loss"];
        lr[e["step"]] = e["lr"];
      } else if (e["event"] == "eval") {
        accuracy[e["step"]] = e["accuracy"];
      } else if (e["event"] == "audit_result") {
        agreed[e["step"]] = e["agreed"].get<bool>() ? 1.0 : 0.0;
      }
    }
    ASSERT_EQ(loss.size(), 6u) << "steps 5, 10, ..., 30";
    for (const auto& [tag, expected] : std::vector<std::pair<std::string, std::map<int64_t, double>>>{
             {"train/loss", loss}, {"train/lr", lr}, {"eval/test/accuracy", accuracy}, {"audit/agreed", agreed}}) {
      const auto found = series(read, tag);
      ASSERT_EQ(found.size(), expected.size()) << "rank " << rank << " " << tag;
      for (const auto& [step, value] : expected) {
        ASSERT_TRUE(found.count(step)) << "rank " << rank << " " << tag << " has no step " << step;
        EXPECT_NEAR(found.at(step), value, 1e-6 * std::max(1.0, std::abs(value))) << tag << " step " << step;
      }
    }
    EXPECT_EQ(series(read, "audit/agreed").at(10), 1.0);
    EXPECT_EQ(series(read, "audit/agreed").at(20), 0.0) << "the perturbation at step 15 must show as a drift";
    EXPECT_GT(series(read, "audit/max_abs_diff").at(20), 1e-4);
    EXPECT_EQ(read["scalars"]["time/forward_backward_s"].size(), 7u) << "every step event and the end";
    EXPECT_EQ(series(read, "train/samples_per_s").size(), 6u);
  }
  // Cut inside the last record: the complete ones stay readable, the rest waits.
  const std::string whole = only_file(run + "/tensorboard/rank0");
  const std::string cut = dir.path() + "/cut.tfevents";
  const auto size = fs::file_size(whole);
  fs::copy_file(whole, cut);
  fs::resize_file(cut, size - 7);
  const auto complete = read_tensorboard(whole), partial = read_tensorboard(cut);
  EXPECT_EQ(partial["records"].get<int>(), complete["records"].get<int>() - 1);
  EXPECT_GT(partial["incomplete_tail_bytes"].get<int>(), 0);
  EXPECT_EQ(series(partial, "train/loss"), series(complete, "train/loss"));
}

}  // namespace
}  // namespace lockstep::testing

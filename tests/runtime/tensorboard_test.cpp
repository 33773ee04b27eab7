// TensorBoard files: the record checksum is CRC-32C (Castagnoli), not zlib's
// CRC-32; and every kind of event a rank writes becomes the scalars its
// contract names, read back by the independent reader (tests/python/tb_reader.py).
#include "runtime/run/tensorboard.h"

#include <filesystem>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/shell.h"

namespace lockstep {
namespace {

TEST(TensorBoardChecksum, IsCrc32cWithItsCheckValue) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(check.data(), check.size()), 0xE3069283u);  // the published check value
  EXPECT_EQ(crc32c("", 0), 0u);
  EXPECT_NE(crc32c(check.data(), check.size()), 0xCBF43926u) << "zlib's CRC-32 of the same bytes";
}

TEST(TensorBoardWriter, EveryEventKindBecomesTheScalarsItsContractNames) {
  testing::TempDir dir;
  std::string file;
  {
    TensorBoardWriter writer(dir.path() + "/rank0");
    file = writer.path();
    const nlohmann::json phases = {{"data", 0.5}, {"forward_backward", 2.25}, {"wall", 9.0}, {"other", 1.0}};
    writer.event({{"event", "step"}, {"step", 10}, {"loss", 1.5}, {"lr", 0.125}, {"samples_per_s", 640.0},
                  {"phases", phases}, {"scaler", {{"scale", 32768.0}, {"skipped", 2}}}});
    writer.event({{"event", "eval"}, {"step", 10}, {"split", "validation"}, {"metrics", {{"accuracy", 0.75}}}});
    writer.event({{"event", "audit_result"}, {"step", 10}, {"agreed", false}, {"max_abs_diff", 0.001}});
    writer.event({{"event", "scaler_skipped_step"}, {"step", 11}, {"scale_before", 65536.0}, {"scale_after", 32768.0}});
    writer.event({{"event", "skipped_step"}, {"step", 12}, {"reason", "no valid target"}});
    writer.event({{"event", "resumed"}, {"step", 8}, {"folder", "checkpoints/step-8"}});
    writer.event({{"event", "checkpoint"}, {"step", 12}, {"folder", "checkpoints/step-12"}});  // no scalars
    writer.event({{"event", "end"}, {"phases", {{"wall", 12.5}}}, {"metrics", {{"steps", 12}}}});
  }
  auto read = testing::python_tool("tb_reader.py", file, 60);
  ASSERT_EQ(read.exit_code, 0) << read.output;
  const auto seen = nlohmann::json::parse(read.output);
  EXPECT_EQ(seen["file_version"], "brain.Event:2");
  EXPECT_EQ(seen["incomplete_tail_bytes"], 0);
  EXPECT_EQ(seen["records"], 8) << "the version record and one per event that holds scalars";
  const std::map<std::string, std::pair<int64_t, double>> expected = {
      {"train/loss", {10, 1.5}},
      {"train/lr", {10, 0.125}},
      {"train/samples_per_s", {10, 640.0}},
      {"time/data_s", {10, 0.5}},
      {"time/forward_backward_s", {10, 2.25}},
      {"scaler/scale", {10, 32768.0}},
      {"scaler/skipped_total", {10, 2.0}},
      {"eval/validation/accuracy", {10, 0.75}},
      {"audit/agreed", {10, 0.0}},
      {"audit/max_abs_diff", {10, 0.001}},
      {"scaler/skipped_step", {11, 1.0}},
      {"train/skipped_step", {12, 1.0}},
      {"run/resumed_at_step", {8, 8.0}},
      {"time/wall_s", {12, 12.5}},
  };
  for (const auto& [tag, point] : expected) {
    ASSERT_TRUE(seen["scalars"].contains(tag)) << tag << " missing from " << seen["scalars"].dump();
    const auto& first = seen["scalars"][tag].front();
    EXPECT_EQ(first[0].get<int64_t>(), point.first) << tag;
    EXPECT_FLOAT_EQ(first[1].get<float>(), float(point.second)) << tag;
  }
  // A step event's running totals have no wall time yet: only the end has it.
  EXPECT_EQ(seen["scalars"]["time/wall_s"].size(), 1u);
  EXPECT_FALSE(seen["scalars"].contains("time/other_s")) << "known at the end only, and the end has none here";
  // The skipped step's scale comes from its event: scaler/scale at 10 and 11.
  EXPECT_EQ(seen["scalars"]["scaler/scale"].back(), nlohmann::json::array({11, 32768.0}));
  EXPECT_EQ(seen["scalars"].size(), expected.size());
}

}  // namespace
}  // namespace lockstep

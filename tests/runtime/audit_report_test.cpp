#include "runtime/audit/audit_report.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace lockstep {
namespace {

namespace fs = std::filesystem;

class AuditReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("lockstep-audit-" + std::to_string(::getpid()))).string();
    fs::create_directories(dir_);
    std::ofstream(dir_ + "/manifest.json") << R"({"world_size": 2})";
  }
  void TearDown() override { fs::remove_all(dir_); }
  void line(int rank, int step, const std::string& a, const std::string& b, const std::string& rng) {
    std::ofstream(dir_ + "/audit-rank" + std::to_string(rank) + ".jsonl", std::ios::app)
        << R"({"step":)" << step << R"(,"rng":")" << rng << R"(","tensors":{"a":")" << a
        << R"(","b":")" << b << "\"}}\n";
  }
  std::string dir_;
};

TEST_F(AuditReportTest, FindsFirstDriftAndReunion) {
  line(0, 1, "x", "y", "r0");
  line(1, 1, "x", "y", "r1");
  line(0, 5, "x", "y", "r0");
  line(1, 5, "x", "Y", "r1");
  line(0, 10, "x", "y", "r0");
  line(1, 10, "x", "y", "r1");
  AuditReport r = audit_run_folder(dir_);
  EXPECT_EQ(r.exit_code, 1) << r.text;
  EXPECT_EQ(r.json["first_drift_step"], 5);
  EXPECT_EQ(r.json["first_drift_tensors"], nlohmann::json::parse(R"(["b"])"));
  EXPECT_EQ(r.json["agreed_again_step"], 10);
  EXPECT_NE(r.text.find("agreed again at step 10"), std::string::npos) << r.text;
}

TEST_F(AuditReportTest, StepsThatDifferBetweenRanksAreInconsistent) {
  line(0, 1, "x", "y", "r0");
  line(1, 2, "x", "y", "r1");
  AuditReport r = audit_run_folder(dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.text.find("inconsistent"), std::string::npos) << r.text;
}

TEST_F(AuditReportTest, EqualStreamsAreAWarningNotDrift) {
  line(0, 1, "x", "y", "same");
  line(1, 1, "x", "y", "same");
  AuditReport r = audit_run_folder(dir_);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.json["streams_shared"], true);
  EXPECT_NE(r.text.find("EQUAL"), std::string::npos);
}

}  // namespace
}  // namespace lockstep

#pragma once
// A report page as headless Chromium sees it (tests/python/browse_report.py:
// Chromium in a network namespace of its own, behind a proxy that records
// every request), for the report tests.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/shell.h"

namespace lockstep::testing {

inline bool chromium_missing() { return std::system("command -v chromium > /dev/null 2>&1") != 0; }

// Where a test's screenshot goes: report-screenshots/ in the test's working
// folder (build/tests under ctest).
inline std::string screenshot_path(const std::string& name) {
  std::filesystem::create_directories("report-screenshots");
  return std::filesystem::absolute("report-screenshots/" + name + ".png").string();
}

// What the browser saw of `html`: {console, page_requests, load_s, blank_s,
// loads_s, text}, timings the median of `repeat` loads.
inline nlohmann::json browse(const std::string& html, const std::string& screenshot = "", int repeat = 1) {
  std::string args = html + " --repeat " + std::to_string(repeat);
  if (!screenshot.empty()) args += " --screenshot " + screenshot;
  auto seen = python_tool("browse_report.py", args, 150 + 30 * repeat);
  EXPECT_EQ(seen.exit_code, 0) << "browse_report.py " << args << "\n" << seen.output;
  auto parsed = nlohmann::json::parse(seen.output, nullptr, false);
  EXPECT_FALSE(parsed.is_discarded()) << seen.output;
  return parsed.is_discarded() ? nlohmann::json::object() : parsed;
}

}  // namespace lockstep::testing

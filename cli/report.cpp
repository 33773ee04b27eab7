// lockstep report: one or more run folders as a self-contained HTML page, or
// their per-step figures as CSV.
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "report/html_report.h"
#include "runtime/base/errors.h"
#include "runtime/run/run_folder.h"

namespace lockstep {

int report_command(const std::vector<std::string>& run_dirs, const std::string& output, bool csv) {
  if (run_dirs.empty()) throw InputError("lockstep report: give at least one run folder (runs/<run-id>)");
  if (run_dirs.size() > kMaxReportRuns)
    throw InputError(fmt::format("lockstep report: {} run folders given; at most {} are overlaid in one report",
                                 run_dirs.size(), kMaxReportRuns));
  std::vector<report::RunRecord> runs;
  for (const auto& dir : run_dirs) {
    runs.push_back(report::load_run(dir));
    for (const auto& problem : runs.back().problems) spdlog::warn("report: {}", problem);
  }
  const std::string text = csv ? report::csv_report(runs) : report::html_report(runs);
  if (output == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  // One run: beside its evidence; several: here, since no one folder is theirs.
  std::string file = output;
  if (file.empty())
    file = (run_dirs.size() == 1 ? (std::filesystem::path(run_dirs[0]) / "") : std::filesystem::path())
               .string() + (csv ? "report.csv" : "report.html");
  write_file_atomically(file, text);
  spdlog::info("report: wrote {} ({:.1f} KiB; {} step rows over {} run(s))", file, double(text.size()) / 1024,
               [&] {
                 size_t rows = 0;
                 for (const auto& run : runs) rows += run.steps.size();
                 return rows;
               }(),
               runs.size());
  return 0;
}

}  // namespace lockstep

#pragma once
// The two forms `lockstep report` writes from loaded run folders.
#include <string>
#include <vector>

#include "report/run_record.h"

namespace lockstep::report {

// One self-contained HTML page (no script, no request to anywhere): outcome,
// loss and evaluation curves (mean and per rank; runs overlaid), throughput,
// time by phase, the audit timeline with the first drift named, restarts
// with their recovery times, decisions, settings (those that differ when
// two runs are given). Every text from the run folders is escaped.
std::string html_report(const std::vector<RunRecord>& runs);

// The per-step figures of every rank as CSV (RFC 4180 quoting), one header
// line: kind (step or eval), run, rank, generation, step, time, loss, lr,
// samples_per_s, one column per phase (running totals, seconds), split and
// one column per evaluation metric.
std::string csv_report(const std::vector<RunRecord>& runs);

}  // namespace lockstep::report

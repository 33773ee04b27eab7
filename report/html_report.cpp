#include "report/html_report.h"

#include <algorithm>
#include <ctime>
#include <set>

#include <fmt/format.h>

#include "report/svg_chart.h"

namespace lockstep::report {
namespace {

const char* kStyle = R"(
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:960px;color:#222}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;width:100%;margin:6px 0} td,th{border:1px solid #ddd;padding:3px 6px;
text-align:left;vertical-align:top;font-size:13px} th{background:#f4f4f4}
.ok{color:#196619;font-weight:600} .warn{color:#a35a00;font-weight:600} .bad{color:#b00020;font-weight:600}
.chart{display:block;margin:6px 0;font-size:11px} .chart .title{font-size:13px;font-weight:600}
.frame{fill:none;stroke:#999} .grid{stroke:#eee} .ytick{text-anchor:end;fill:#555}
.xtick{text-anchor:middle;fill:#555} .xlabel,.ylabel{text-anchor:middle;fill:#333}
.xstart{text-anchor:start} .xend{text-anchor:end}
.note{fill:#777;font-style:italic} .marker{font-size:11px} .empty{fill:#999}
.barlabel{fill:#333} .muted{color:#777} code{font-size:12px}
)";

std::string fmt_number(double value) { return fmt::format("{:.6g}", value); }

std::string status_class(const std::string& status) {
  if (status == "completed") return "ok";
  if (status == "running" || status == "stopped" || status == "completed_with_drift") return "warn";
  return "bad";
}

std::string ranks_text(const std::vector<int>& ranks, int world) {
  if (int(ranks.size()) == world && world > 1) return "all " + std::to_string(world);
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// Short names for runs in legends: the run id, or "A: id" / "B: id" for two.
std::string run_label(const std::vector<RunRecord>& runs, size_t i) {
  if (runs.size() == 1) return runs[i].run_id;
  return std::string(1, char('A' + i)) + ": " + runs[i].run_id;
}

// The mean over ranks at each step; where a restart redid steps, the
// latest generation's figures.
std::vector<Point> mean_over_ranks(const RunRecord& run, double StepRow::*field) {
  std::map<int64_t, std::tuple<int, double, int>> by_step;  // step -> generation, sum, count
  for (const auto& row : run.steps) {
    auto& [generation, sum, count] = by_step[row.step];
    if (row.generation > generation) generation = row.generation, sum = 0, count = 0;
    if (row.generation == generation) sum += row.*field, ++count;
  }
  std::vector<Point> out;
  for (const auto& [step, entry] : by_step)
    if (std::get<2>(entry) > 0) out.push_back({double(step), std::get<1>(entry) / std::get<2>(entry)});
  return out;
}

std::vector<Point> of_rank(const RunRecord& run, int rank, double StepRow::*field) {
  std::vector<Point> out;
  for (const auto& row : run.steps)
    if (row.rank == rank) out.push_back({double(row.step), row.*field});
  return out;
}

std::vector<ChartMarker> markers_of(const std::vector<RunRecord>& runs) {
  std::vector<ChartMarker> out;
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string who = runs.size() > 1 ? std::string(1, char('A' + i)) + " " : "";
    for (const auto& r : runs[i].restarts)
      if (r.steps_reached >= 0)  // where the generation stopped; unknown: no line to draw
        out.push_back({double(r.steps_reached),
                       who + "restart: generation " + std::to_string(r.generation) +
                           (r.resumed_from_step >= 0 ? ", resumed from step " + std::to_string(r.resumed_from_step)
                                                     : std::string()),
                       "#ff7f0e"});
    if (runs[i].first_drift_step >= 0)
      out.push_back({double(runs[i].first_drift_step),
                     who + "first drift: step " + std::to_string(runs[i].first_drift_step), "#b00020"});
  }
  return out;
}

std::string curve_of_steps(const std::vector<RunRecord>& runs, const std::string& title,
                           const std::string& y_label, double StepRow::*field, bool mean_line) {
  std::vector<ChartSeries> series;
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& run = runs[i];
    const std::string base = palette(i);
    if (mean_line)
      series.push_back({run_label(runs, i) + " mean", base, mean_over_ranks(run, field), 2.2, i > 0});
    std::set<int> ranks;
    for (const auto& row : run.steps) ranks.insert(row.rank);
    size_t shade = 2;
    for (int rank : ranks) {
      if (ranks.size() > 8 && mean_line) break;  // many ranks: the mean speaks for them
      series.push_back({(runs.size() > 1 ? std::string(1, char('A' + i)) + " " : "") + "rank " +
                            std::to_string(rank),
                        palette(runs.size() + (mean_line ? 0 : i * 4) + shade++), of_rank(run, rank, field),
                        mean_line ? 1.0 : 1.5, i > 0});
    }
  }
  return line_chart({title, y_label}, series, markers_of(runs));
}

bool is_interval_bound(const std::string& metric) {
  auto ends = [&](const std::string& tail) {
    return metric.size() > tail.size() && metric.compare(metric.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends("_ci95_low") || ends("_ci95_high");
}

// Each metric over the steps, with its 95% interval drawn as two thin
// dashed lines where the evaluation computed one, so that a curve from few
// samples is seen to be uncertain.
std::string evaluation_curves(const std::vector<RunRecord>& runs) {
  std::set<std::pair<std::string, std::string>> kinds;  // split, metric
  for (const auto& run : runs)
    for (const auto& e : run.evals)
      for (const auto& [metric, value] : e.metrics)
        if (!is_interval_bound(metric)) kinds.insert({e.split, metric});
  if (kinds.empty()) return "<p class=\"muted\">No evaluation was recorded.</p>\n";
  std::string out;
  for (const auto& [split, metric] : kinds) {
    std::vector<ChartSeries> series;
    std::string latest;
    for (size_t i = 0; i < runs.size(); ++i) {
      // Evaluation is over the whole set, the same figure on every rank: rank 0's.
      std::vector<Point> points, low, high;
      std::string last_of_run;
      for (const auto& e : runs[i].evals) {
        if (e.rank != 0 || e.split != split || !e.metrics.count(metric)) continue;
        points.push_back({double(e.step), e.metrics.at(metric)});
        auto l = e.metrics.find(metric + "_ci95_low"), h = e.metrics.find(metric + "_ci95_high");
        if (l != e.metrics.end() && h != e.metrics.end()) {
          low.push_back({double(e.step), l->second});
          high.push_back({double(e.step), h->second});
          last_of_run = fmt::format("{} at step {}: {:.4f}, 95% interval [{:.4f}, {:.4f}]", run_label(runs, i),
                                    e.step, e.metrics.at(metric), l->second, h->second);
        }
      }
      if (!last_of_run.empty()) latest += (latest.empty() ? "" : "; ") + last_of_run;
      series.push_back({run_label(runs, i), palette(i), points, 2, i > 0});
      if (!low.empty()) {
        series.push_back({run_label(runs, i) + " 95% low", palette(i), low, 0.75, true});
        series.push_back({run_label(runs, i) + " 95% high", palette(i), high, 0.75, true});
      }
    }
    out += line_chart({"evaluation: " + split + " " + metric, metric}, series, markers_of(runs));
    if (!latest.empty()) out += "<p class=\"muted\">" + escape(latest) + "</p>\n";
  }
  return out;
}

std::string phase_chart(const std::vector<RunRecord>& runs) {
  static const char* order[] = {"startup", "data", "forward_backward", "comm_wait", "optimizer",
                                "audit", "eval", "checkpoint", "other"};
  std::vector<BarRow> rows;
  for (size_t i = 0; i < runs.size(); ++i)
    for (const auto& [rank, phases] : runs[i].phases_by_rank) {
      BarRow row{(runs.size() > 1 ? std::string(1, char('A' + i)) + " " : "") + "rank " + std::to_string(rank), {}};
      for (const char* name : order)
        if (auto it = phases.find(name); it != phases.end()) row.parts.push_back({name, it->second});
      rows.push_back(std::move(row));
    }
  return stacked_bars("where the wall time went, by phase (seconds)", rows);
}

std::string audit_timeline(const RunRecord& run, const std::string& label) {
  std::string out = "<h3>" + escape(label) + "</h3>\n";
  if (run.audits.empty()) return out + "<p class=\"muted\">No audit was recorded (audit.every = 0, or the run "
                                       "ended before the first).</p>\n";
  const int64_t disagreed = std::count_if(run.audits.begin(), run.audits.end(),
                                          [](const AuditMark& a) { return !a.agreed; });
  if (run.first_drift_step >= 0)
    out += fmt::format("<p class=\"bad\">First drift at step {}: {} ({} of {} audits disagreed)</p>\n",
                       run.first_drift_step, escape(run.first_drift), disagreed, run.audits.size());
  else
    out += fmt::format("<p class=\"ok\">The ranks agreed at all {} audits.</p>\n", run.audits.size());
  const double width = 920, left = 70, right = 20, plot_w = width - left - right;
  const double x0 = 0, x1 = double(std::max<int64_t>(run.audits.back().step, 1));
  auto x = [&](double step) { return left + (step - x0) / (x1 - x0) * plot_w; };
  out += fmt::format("<svg class=\"chart\" viewBox=\"0 0 {0} 64\" width=\"{0}\" height=\"64\" role=\"img\" "
                     "aria-label=\"audit timeline\"><line x1=\"{1}\" x2=\"{2}\" y1=\"26\" y2=\"26\" "
                     "stroke=\"#bbb\"/>",
                     width, left, left + plot_w);
  // Many audits: draw at most one dot per pixel column, a disagreement winning.
  std::map<int, const AuditMark*> columns;
  for (const auto& mark : run.audits) {
    auto& slot = columns[int(x(double(mark.step)))];
    if (!slot || (slot->agreed && !mark.agreed)) slot = &mark;
  }
  for (const auto& [column, mark] : columns)
    out += fmt::format("<circle cx=\"{}\" cy=\"26\" r=\"4\" fill=\"{}\"><title>step {}: {}{}</title></circle>",
                       column, mark->agreed ? "#2ca02c" : "#b00020", mark->step,
                       mark->agreed ? "agreed" : "DISAGREED ", escape(mark->agreed ? "" : mark->verdict));
  if (run.first_drift_step >= 0)
    out += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"8\" y2=\"44\" stroke=\"#b00020\" "
                       "stroke-dasharray=\"3 2\"/><text x=\"{1:.1f}\" y=\"12\" fill=\"#b00020\" "
                       "class=\"marker\">first drift: step {2}</text>",
                       x(double(run.first_drift_step)), x(double(run.first_drift_step)) + 4,
                       run.first_drift_step);
  out += fmt::format("<text x=\"{}\" y=\"58\" class=\"xtick xstart\">step 0</text><text x=\"{}\" "
                     "y=\"58\" class=\"xtick xend\">step {}</text></svg>\n",
                     left, left + plot_w, int64_t(x1));
  return out;
}

std::string outcome_table(const std::vector<RunRecord>& runs) {
  std::string out = "<table><tr><th>run</th><th>outcome</th><th>steps</th><th>ranks</th><th>wall time</th>"
                    "<th>final figures</th><th>restarts</th></tr>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& run = runs[i];
    std::string figures;
    for (const char* name : {"test_accuracy", "test_loss", "final_train_loss", "skipped_steps"})
      if (auto it = run.final_metrics.find(name); it != run.final_metrics.end())
        figures += std::string(figures.empty() ? "" : "<br>") + name + " " + fmt_number(it->second);
    const std::string steps =
        run.total_steps > 0 ? fmt::format("{} of {} ({:.0f}%)", run.last_step, run.total_steps,
                                          100.0 * double(run.last_step) / double(run.total_steps))
                            : std::to_string(run.last_step);
    // The job's own wall time where the coordinator recorded it, with the
    // time restarts cost apart: waiting is not training.
    double recovering = 0;
    for (const auto& r : run.restarts) recovering += std::max(0.0, r.recovery_s);
    std::string wall = fmt::format("{:.1f} s", run.job_wall_s >= 0 ? run.job_wall_s : run.wall_s);
    if (run.job_wall_s >= 0 && !run.restarts.empty())
      wall += fmt::format("<br><span class=\"muted\">{:.1f} s of it recovering from {} restart(s); rank 0's last "
                          "generation {:.1f} s</span>",
                          recovering, run.restarts.size(), run.wall_s);
    out += fmt::format("<tr><td>{}<br><code class=\"muted\">{}</code><br><span class=\"muted\">started {}"
                       "</span></td><td><span class=\"{}\">{}</span><br>{}</td><td>{}</td><td>{}</td>"
                       "<td>{}</td><td>{}</td><td>{}</td></tr>\n",
                       escape(run_label(runs, i)), escape(run.folder), escape(run.started_at),
                       status_class(run.status), escape(run.status.empty() ? "unknown" : run.status),
                       escape(run.ending), steps, run.world_size, wall, figures, run.restarts.size());
  }
  out += "</table>\n";
  for (const auto& run : runs)
    for (const auto& problem : run.problems) out += "<p class=\"warn\">" + escape(problem) + "</p>\n";
  return out;
}

// A figure the manifest holds, or "not measured" where it could not be (-1).
std::string known(int64_t value) { return value >= 0 ? std::to_string(value) : "not measured"; }

std::string restart_table(const std::vector<RunRecord>& runs) {
  std::string rows;
  for (size_t i = 0; i < runs.size(); ++i)
    for (const auto& r : runs[i].restarts)
      rows += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                          "<td>{}</td></tr>\n",
                          escape(run_label(runs, i)), r.generation,
                          r.dead_rank >= 0 ? std::to_string(r.dead_rank) : "none yet (lost before ranks were assigned)",
                          escape(r.reason), known(r.steps_reached), known(r.resumed_from_step), known(r.steps_redone),
                          r.recovery_s >= 0 ? fmt::format("{:.2f} s", r.recovery_s) : "not measured");
  if (rows.empty()) return "<p class=\"muted\">No restart.</p>\n";
  return "<table><tr><th>run</th><th>generation</th><th>lost rank</th><th>why</th><th>steps reached</th>"
         "<th>resumed from step</th><th>steps redone</th><th>recovery (death to first step)</th></tr>\n" +
         rows + "</table>\n";
}

// An elastic job's world size over time: one row per generation after the first.
std::string membership_table(const std::vector<RunRecord>& runs) {
  std::string rows;
  for (size_t i = 0; i < runs.size(); ++i)
    for (const auto& m : runs[i].membership)
      rows += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{} &rarr; {}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                          escape(run_label(runs, i)), m.generation, known(m.step), m.world_size_before, m.world_size,
                          escape(m.kind), escape(m.reason),
                          m.seconds >= 0 ? fmt::format("{:.1f} s", m.seconds) : "not measured");
  if (rows.empty()) return "<p class=\"muted\">The world size never changed.</p>\n";
  return "<table><tr><th>run</th><th>generation</th><th>from step</th><th>ranks</th><th>kind</th><th>why</th>"
         "<th>end of the last generation to the first step</th></tr>\n" + rows + "</table>\n";
}

std::string decision_table(const RunRecord& run) {
  std::string out = "<table><tr><th>decision</th><th>value</th><th>reason</th><th>ranks</th></tr>\n";
  for (const auto& d : run.decisions)
    out += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", escape(d.what),
                       escape(d.value), escape(d.reason), ranks_text(d.ranks, run.world_size));
  return out + "</table>\n";
}

std::string settings_tables(const std::vector<RunRecord>& runs) {
  std::string out;
  if (runs.size() > 1) {
    std::set<std::string> keys;
    for (const auto& run : runs)
      for (const auto& [key, value] : run.settings) keys.insert(key);
    auto value = [](const RunRecord& run, const std::string& key) {
      auto it = run.settings.find(key);
      return it == run.settings.end() ? std::string("(not set)") : it->second;
    };
    std::string rows;
    for (const auto& key : keys) {
      bool differ = false;
      for (const auto& run : runs) differ = differ || value(run, key) != value(runs[0], key);
      if (!differ) continue;
      rows += "<tr><td>" + escape(key) + "</td>";
      for (const auto& run : runs) rows += "<td>" + escape(value(run, key)) + "</td>";
      rows += "</tr>\n";
    }
    out += "<h3>Settings that differ</h3>\n";
    if (rows.empty()) {
      out += "<p>None: the runs have the same settings.</p>\n";
    } else {
      out += "<table><tr><th>key</th>";
      for (size_t i = 0; i < runs.size(); ++i) out += "<th>" + escape(run_label(runs, i)) + "</th>";
      out += "</tr>\n" + rows + "</table>\n";
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    out += "<details" + std::string(runs.size() == 1 ? " open" : "") + "><summary>All settings of " +
           escape(run_label(runs, i)) + "</summary>\n<table><tr><th>key</th><th>value</th><th>from</th></tr>\n";
    for (const auto& [key, value] : runs[i].settings) {
      auto source = runs[i].sources.find(key);
      out += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>\n", escape(key), escape(value),
                         escape(source == runs[i].sources.end() ? "" : source->second));
    }
    out += "</table></details>\n";
  }
  return out;
}

}  // namespace

std::string html_report(const std::vector<RunRecord>& runs) {
  std::string title = "lockstep report: " + runs[0].run_id;
  if (runs.size() > 1) title += " and " + runs[1].run_id;
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
                    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
                    "style-src 'unsafe-inline'; img-src data:\">\n<title>" +
                    escape(title) + "</title>\n<style>" + kStyle + "</style></head><body>\n";
  out += "<h1>" + escape(title) + "</h1>\n";
  out += fmt::format("<p class=\"muted\">Written by lockstep report at {} from {} run folder(s). Charts are "
                     "drawn as SVG in this file; it needs no network.</p>\n",
                     [] {
                       char buffer[32];
                       std::time_t now = std::time(nullptr);
                       std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
                       return std::string(buffer);
                     }(),
                     runs.size());
  out += "<h2 id=\"outcome\">Outcome</h2>\n" + outcome_table(runs);
  out += "<h2 id=\"loss\">Training loss</h2>\n<p class=\"muted\">The loss each rank logs is the mean over "
         "the global batch (all ranks), so the ranks' lines lie on the mean's.</p>\n" +
         curve_of_steps(runs, "training loss (mean over ranks, and each rank)", "loss", &StepRow::loss, true);
  out += "<h2 id=\"evaluation\">Evaluation</h2>\n" + evaluation_curves(runs);
  out += "<h2 id=\"throughput\">Throughput</h2>\n" +
         curve_of_steps(runs, "samples per second, each rank", "samples/s", &StepRow::samples_per_s, false) +
         curve_of_steps(runs, "learning rate", "lr", &StepRow::lr, true);
  out += "<h2 id=\"phases\">Where the time went</h2>\n" + phase_chart(runs);
  out += "<h2 id=\"audit\">Audit: did the ranks agree?</h2>\n";
  for (size_t i = 0; i < runs.size(); ++i) out += audit_timeline(runs[i], run_label(runs, i));
  out += "<h2 id=\"restarts\">Restarts</h2>\n" + restart_table(runs);
  out += "<h2 id=\"world-size\">World size over time</h2>\n" + membership_table(runs);
  out += "<h2 id=\"decisions\">Decisions</h2>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs.size() > 1) out += "<h3>" + escape(run_label(runs, i)) + "</h3>\n";
    out += decision_table(runs[i]);
  }
  out += "<h2 id=\"settings\">Settings</h2>\n" + settings_tables(runs);
  return out + "</body></html>\n";
}

namespace {

std::string csv_field(const std::string& value) {
  if (value.find_first_of(",\"\n\r") == std::string::npos) return value;
  std::string out = "\"";
  for (char c : value) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

std::string csv_report(const std::vector<RunRecord>& runs) {
  std::set<std::string> phases, metrics;
  for (const auto& run : runs) {
    for (const auto& row : run.steps)
      for (const auto& [name, seconds] : row.phases) phases.insert(name);
    for (const auto& e : run.evals)
      for (const auto& [name, value] : e.metrics) metrics.insert(name);
  }
  std::string out = "kind,run,rank,generation,step,time,loss,lr,samples_per_s";
  for (const auto& p : phases) out += "," + csv_field("phase_" + p + "_s");
  out += ",split";
  for (const auto& m : metrics) out += "," + csv_field("eval_" + m);
  out += "\n";
  for (const auto& run : runs) {
    const std::string id = csv_field(run.run_id);
    for (const auto& row : run.steps) {
      out += fmt::format("step,{},{},{},{},{:.6f},{:.9g},{:.9g},{:.6g}", id, row.rank, row.generation, row.step,
                         row.time, row.loss, row.lr, row.samples_per_s);
      for (const auto& p : phases) {
        auto it = row.phases.find(p);
        out += it == row.phases.end() ? "," : fmt::format(",{:.6g}", it->second);
      }
      out += "," + std::string(metrics.size(), ',') + "\n";
    }
    for (const auto& e : run.evals) {
      out += fmt::format("eval,{},{},,{},,,,", id, e.rank, e.step) + std::string(phases.size(), ',') + "," +
             csv_field(e.split);
      for (const auto& m : metrics) {
        auto it = e.metrics.find(m);
        out += it == e.metrics.end() ? "," : fmt::format(",{:.9g}", it->second);
      }
      out += "\n";
    }
  }
  return out;
}

}  // namespace lockstep::report

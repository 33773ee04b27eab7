#pragma once
// Hand-drawn SVG charts for the HTML report: no script, no external file,
// every label escaped. A series longer than `max_points` is drawn as that
// many bucket means with a min-max band, and the chart says so.
#include <string>
#include <vector>

#include "report/run_record.h"

namespace lockstep::report {

// Text made safe for HTML and SVG (element content and quoted attributes).
std::string escape(const std::string& text);

struct ChartSeries {
  std::string label;
  std::string color;  // a CSS colour
  std::vector<Point> points;
  double width = 1.5;
  bool dashed = false;
};

// A vertical line at a step with its label (a restart, the first drift).
struct ChartMarker {
  double step = 0;
  std::string label;
  std::string color;
};

struct ChartOptions {
  std::string title;
  std::string y_label;
  int width = 920, height = 280;
  size_t max_points = 1000;  // per series; more are downsampled
};

std::string line_chart(const ChartOptions& options, const std::vector<ChartSeries>& series,
                       const std::vector<ChartMarker>& markers = {});

// One horizontal stacked bar per row (seconds by part), with a legend.
struct BarRow {
  std::string label;
  std::vector<std::pair<std::string, double>> parts;
};
std::string stacked_bars(const std::string& title, const std::vector<BarRow>& rows);

// The n-th of a fixed palette of distinguishable colours.
std::string palette(size_t n);

}  // namespace lockstep::report

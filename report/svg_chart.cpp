#include "report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace lockstep::report {
namespace {

// About `count` round tick values covering [low, high].
std::vector<double> ticks(double low, double high, int count) {
  std::vector<double> out;
  if (!(high > low)) return {low};
  const double raw = (high - low) / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double f : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (f * magnitude >= raw) {
      step = f * magnitude;
      break;
    }
  // t = first + i * step, never t += step: a step below the spacing of
  // doubles near `low` would never move t, and the loop would never end.
  const double first = std::ceil(low / step) * step;
  for (int i = 0; i <= 4 * count + 2; ++i) {
    const double t = first + i * step;
    if (t > high + step * 1e-9) break;
    out.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return out;
}

std::string tick_label(double value) {
  // Steps are whole numbers: 100000, not 1e+05, beside 80000.
  if (value == std::floor(value) && std::abs(value) < 1e9) return fmt::format("{:.0f}", value);
  if (value != 0 && (std::abs(value) >= 1e5 || std::abs(value) < 1e-3)) return fmt::format("{:.2g}", value);
  return fmt::format("{:.6g}", value);
}

struct Downsampled {
  std::vector<Point> mean, low, high;
  bool reduced = false;
};

// Bucket means with each bucket's minimum and maximum, in step order.
Downsampled downsample(const std::vector<Point>& points, size_t max_points) {
  Downsampled out;
  if (points.size() <= max_points || max_points < 2) {
    out.mean = points;
    return out;
  }
  out.reduced = true;
  const size_t per_bucket = (points.size() + max_points - 1) / max_points;
  for (size_t begin = 0; begin < points.size(); begin += per_bucket) {
    const size_t end = std::min(points.size(), begin + per_bucket);
    double step = 0, sum = 0, low = std::numeric_limits<double>::infinity(), high = -low;
    for (size_t i = begin; i < end; ++i) {
      step += points[i].step;
      sum += points[i].value;
      low = std::min(low, points[i].value);
      high = std::max(high, points[i].value);
    }
    const double n = double(end - begin);
    // Clamped: the mean of ten 0.01s sums to 0.0099999999999999985.
    out.mean.push_back({step / n, std::clamp(sum / n, low, high)});
    out.low.push_back({step / n, low});
    out.high.push_back({step / n, high});
  }
  return out;
}

}  // namespace

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string palette(size_t n) {
  static const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return colours[n % (sizeof(colours) / sizeof(colours[0]))];
}

std::string line_chart(const ChartOptions& options, const std::vector<ChartSeries>& series,
                       const std::vector<ChartMarker>& markers) {
  const double left = 70, right = 20, top = 28, bottom = 40;
  const double plot_w = options.width - left - right, plot_h = options.height - top - bottom;
  std::vector<Downsampled> drawn;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  size_t longest = 0, shown = 0;
  for (const auto& s : series) {
    drawn.push_back(downsample(s.points, options.max_points));
    const auto& d = drawn.back();
    if (d.reduced) {
      longest = std::max(longest, s.points.size());
      shown = std::max(shown, d.mean.size());
    }
    for (const auto* part : {&d.mean, &d.low, &d.high})
      for (const auto& p : *part) {
        if (!std::isfinite(p.value)) continue;
        x0 = std::min(x0, p.step), x1 = std::max(x1, p.step);
        y0 = std::min(y0, p.value), y1 = std::max(y1, p.value);
      }
  }
  for (const auto& m : markers) x0 = std::min(x0, m.step), x1 = std::max(x1, m.step);
  x0 = std::min(x0, 0.0);  // steps: the axis starts where training did

  std::string svg = fmt::format(
      "<svg class=\"chart\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" role=\"img\" "
      "aria-label=\"{2}\">\n<text x=\"{3}\" y=\"17\" class=\"title\">{2}</text>\n",
      options.width, options.height, escape(options.title), left);
  if (!std::isfinite(x0) || !std::isfinite(y0)) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" class=\"empty\">no points recorded</text>\n</svg>\n",
                       left + 10, top + plot_h / 2);
    return svg;
  }
  if (x1 == x0) x0 -= 1, x1 += 1;
  // A constant series (a fixed learning rate) is flat even where bucket
  // means round a last bit away from it (0.0099999999999999985 vs 0.01).
  if (y1 - y0 <= 1e-9 * std::max(std::abs(y0), std::abs(y1)))
    y0 -= std::max(1e-6, std::abs(y0) * 0.05), y1 += std::max(1e-6, std::abs(y1) * 0.05);
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
  auto x = [&](double step) { return left + (step - x0) / (x1 - x0) * plot_w; };
  auto y = [&](double value) { return top + (1 - (value - y0) / (y1 - y0)) * plot_h; };

  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>\n", left, top,
                     plot_w, plot_h);
  for (double t : ticks(y0, y1, 5))
    svg += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" class=\"grid\"/>"
                       "<text x=\"{3}\" y=\"{4:.1f}\" class=\"ytick\">{5}</text>\n",
                       left, left + plot_w, y(t), left - 6, y(t) + 4, tick_label(t));
  for (double t : ticks(x0, x1, 8))
    svg += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" class=\"grid\"/>"
                       "<text x=\"{0:.1f}\" y=\"{3}\" class=\"xtick\">{4}</text>\n",
                       x(t), top, top + plot_h, top + plot_h + 16, tick_label(t));
  svg += fmt::format("<text x=\"{}\" y=\"{}\" class=\"xlabel\">step</text>\n", left + plot_w / 2,
                     options.height - 4);
  svg += fmt::format("<text transform=\"translate(14 {}) rotate(-90)\" class=\"ylabel\">{}</text>\n",
                     top + plot_h / 2, escape(options.y_label));

  for (size_t i = 0; i < series.size(); ++i) {
    const auto& d = drawn[i];
    if (d.reduced) {  // the min-max band under the bucket means
      std::string band;
      for (const auto& p : d.high) band += fmt::format("{:.1f},{:.1f} ", x(p.step), y(p.value));
      for (auto it = d.low.rbegin(); it != d.low.rend(); ++it)
        band += fmt::format("{:.1f},{:.1f} ", x(it->step), y(it->value));
      svg += fmt::format("<polygon points=\"{}\" fill=\"{}\" fill-opacity=\"0.15\" stroke=\"none\"/>\n",
                         band, series[i].color);
    }
    std::string line;
    for (const auto& p : d.mean)
      if (std::isfinite(p.value)) line += fmt::format("{:.1f},{:.1f} ", x(p.step), y(p.value));
    svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\"{}>"
                       "<title>{}</title></polyline>\n",
                       line, series[i].color, series[i].width,
                       series[i].dashed ? " stroke-dasharray=\"5 3\"" : "", escape(series[i].label));
    if (d.mean.size() == 1)
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", x(d.mean[0].step),
                         y(d.mean[0].value), series[i].color);
  }
  for (size_t i = 0; i < markers.size(); ++i) {
    const auto& m = markers[i];
    svg += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"{3}\" "
                       "stroke-dasharray=\"4 3\" stroke-width=\"1.5\"><title>{4}</title></line>"
                       "<text x=\"{5:.1f}\" y=\"{6}\" fill=\"{3}\" class=\"marker\">{4}</text>\n",
                       x(m.step), top, top + plot_h, m.color, escape(m.label), x(m.step) + 4,
                       top + 12 + 12 * double(i % 4));
  }
  if (longest > 0)
    svg += fmt::format("<text x=\"{}\" y=\"17\" class=\"note\" text-anchor=\"end\">downsampled: {} points "
                       "per series shown as {} bucket means, band = min to max</text>\n",
                       left + plot_w, longest, shown);
  svg += "<g class=\"legend\">";
  double legend_x = left + 8;
  for (const auto& s : series) {
    svg += fmt::format("<rect x=\"{:.0f}\" y=\"{}\" width=\"12\" height=\"3\" fill=\"{}\"/>"
                       "<text x=\"{:.0f}\" y=\"{}\">{}</text>",
                       legend_x, top + plot_h - 12, s.color, legend_x + 16, top + plot_h - 8,
                       escape(s.label));
    legend_x += 24 + 6.5 * double(s.label.size());
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

std::string stacked_bars(const std::string& title, const std::vector<BarRow>& rows) {
  const double left = 150, right = 20, bar_h = 22, gap = 10, top = 28;
  const double width = 920, plot_w = width - left - right;
  double longest = 0;
  std::vector<std::string> names;  // in first-seen order, one colour each
  for (const auto& row : rows) {
    double total = 0;
    for (const auto& [name, seconds] : row.parts) {
      total += std::max(0.0, seconds);
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
    longest = std::max(longest, total);
  }
  const double height = top + double(rows.size()) * (bar_h + gap) + 40;
  std::string svg = fmt::format(
      "<svg class=\"chart\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" role=\"img\" "
      "aria-label=\"{2}\">\n<text x=\"{3}\" y=\"17\" class=\"title\">{2}</text>\n",
      width, height, escape(title), left);
  if (longest <= 0) return svg + "<text x=\"160\" y=\"50\" class=\"empty\">no times recorded</text></svg>\n";
  auto colour = [&](const std::string& name) {
    return palette(size_t(std::find(names.begin(), names.end(), name) - names.begin()));
  };
  for (size_t r = 0; r < rows.size(); ++r) {
    const double y = top + double(r) * (bar_h + gap);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" class=\"ytick\">{}</text>", left - 8, y + bar_h * 0.7,
                       escape(rows[r].label));
    double x = left, total = 0;
    for (const auto& [name, seconds] : rows[r].parts) {
      if (seconds <= 0) continue;
      const double w = seconds / longest * plot_w;
      total += seconds;
      svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\">"
                         "<title>{}: {:.3g} s</title></rect>",
                         x, y, std::max(w, 0.5), bar_h, colour(name), escape(rows[r].label + " " + name),
                         seconds);
      x += w;
    }
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"barlabel\">{:.3g} s</text>\n",
                       std::min(x + 4, width - 60), y + bar_h * 0.7, total);
  }
  double legend_x = left;
  const double legend_y = top + double(rows.size()) * (bar_h + gap) + 14;
  svg += "<g class=\"legend\">";
  for (const auto& name : names) {
    svg += fmt::format("<rect x=\"{:.0f}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/>"
                       "<text x=\"{:.0f}\" y=\"{}\">{}</text>",
                       legend_x, legend_y - 9, colour(name), legend_x + 14, legend_y, escape(name));
    legend_x += 30 + 6.5 * double(name.size());
  }
  return svg + "</g>\n</svg>\n";
}

}  // namespace lockstep::report

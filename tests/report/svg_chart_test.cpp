// The report's charts on series a long run produces: they must finish,
// draw every series and say when they downsample.
#include <cmath>

#include <gtest/gtest.h>


#include "report/svg_chart.h"

namespace lockstep::report {
namespace {

std::vector<Point> constant(size_t n, double value) {
  std::vector<Point> points;
  for (size_t i = 1; i <= n; ++i) points.push_back({double(i * 10), value});
  return points;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A fixed learning rate over 10,000 step events: the bucket means of ten
// 0.01s sum to a last bit below 0.01. That range, narrower than the spacing
// of doubles, once made the tick loop run until memory ran out.
TEST(SvgChart, AConstantSeriesOfTenThousandPointsIsDrawnFlatAndSaysItIsDownsampled) {
  ChartOptions options;
  options.title = "learning rate";
  const std::string svg = line_chart(options, {{"lr", "#000", constant(10000, 0.01)}});
  EXPECT_NE(svg.find("downsampled: 10000 points per series shown as 1000"), std::string::npos) << svg.substr(0, 600);
  EXPECT_EQ(count(svg, "<polyline"), 1u);
  EXPECT_GE(count(svg, "class=\"ytick\""), 2u);
  EXPECT_LE(count(svg, "class=\"ytick\""), 22u);
  EXPECT_LT(svg.size(), 200u * 1024);
}

// Values a last bit apart around a large number: ticks stay a handful.
TEST(SvgChart, ARangeBelowTheSpacingOfDoublesGivesAFewTicks) {
  const double big = 1e17;
  std::vector<Point> points = {{0, big}, {1, std::nextafter(big, 2e17)}, {2, big}};
  const std::string svg = line_chart({}, {{"a", "#000", points}});
  EXPECT_LE(count(svg, "class=\"ytick\""), 22u);
  EXPECT_EQ(svg.find("downsampled"), std::string::npos);
}

// Each drawn point stays inside its bucket's band: a mean is clamped to
// the bucket's minimum and maximum.
TEST(SvgChart, DownsampledMeansOfRealValuesStayInsideTheirBand) {
  std::vector<Point> points;
  for (int i = 0; i < 5000; ++i) points.push_back({double(i), (i % 7) * 0.1 + 1.0 / (1 + i)});
  const std::string svg = line_chart({}, {{"loss", "#000", points}});
  EXPECT_NE(svg.find("downsampled: 5000 points per series shown as 1000"), std::string::npos);
  EXPECT_EQ(count(svg, "<polygon"), 1u);  // the min-max band
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::report

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>

#include "perf/bench.hpp"

namespace kvstream::bench {

Status plot_xy(const std::vector<PlotSeries>& series, const std::string& xlabel, const std::string& ylabel, bool log_y,
               const std::string& png) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0)
    return make_status(StatusCode::unsupported, "--plot needs gnuplot (apt-get install gnuplot-nox)");
  const std::string dat = png + ".dat", gp = png + ".gp";
  std::ofstream d(dat);
  for (const PlotSeries& s : series) {
    d << "# " << s.name << "\n";
    for (auto [x, y] : s.points) d << x << " " << y << "\n";
    d << "\n\n";
  }
  d.close();
  std::ofstream g(gp);
  g << "set terminal pngcairo size 1000,650\nset output '" << png << "'\n";
  g << "set xlabel '" << xlabel << "'\nset ylabel '" << ylabel << "'\nset grid\nset key outside right\n";
  if (log_y) g << "set logscale y\n";
  g << "plot ";
  for (size_t i = 0; i < series.size(); ++i)
    // Sweeps of many settings are clouds, not curves: points only.
    g << (i ? ", " : "") << "'" << dat << "' index " << i << " with "
      << (series[i].points.size() > 12 ? "points" : "linespoints") << " title '" << series[i].name << "'";
  g << "\n";
  g.close();
  if (std::system(fmt::format("gnuplot '{}'", gp).c_str()) != 0)
    return make_status(StatusCode::internal, "gnuplot failed on {}", gp);
  std::filesystem::remove(gp);
  return {};
}

namespace {
// gnuplot strings are single-quoted: a quote inside is doubled.
std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}
}  // namespace

Status plot_panels(const std::vector<PlotPanel>& panels, uint32_t columns, const std::string& title,
                   const std::string& xlabel, const std::string& ylabel, const std::string& png) {
  if (panels.empty() || columns == 0) return make_status(StatusCode::invalid_argument, "plot_panels: nothing to plot");
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0)
    return make_status(StatusCode::unsupported, "--plot needs gnuplot (apt-get install gnuplot-nox)");
  const std::string dat = png + ".dat", gp = png + ".gp";
  const auto rows = uint32_t((panels.size() + columns - 1) / columns);
  std::ofstream d(dat);
  std::ofstream g(gp);
  g << "set terminal pngcairo size " << 480 * columns << "," << 380 * rows + 40 << " font ',10'\n";
  g << "set output " << quoted(png) << "\n";
  g << "set logscale xy\nset grid xtics ytics mytics\nset format y '%g'\n";
  g << "set multiplot layout " << rows << "," << columns << " title " << quoted(title) << "\n";
  size_t index = 0;
  for (size_t p = 0; p < panels.size(); ++p) {
    const PlotPanel& panel = panels[p];
    // Ticks at the context lengths measured, a little room either side on a log axis.
    std::set<double> xs;
    for (const auto& s : panel.series)
      for (auto [x, y] : s.data.points) xs.insert(x);
    if (xs.empty()) continue;
    g << "set title " << quoted(panel.title) << "\nset xrange [" << *xs.begin() / 1.3 << ":" << *xs.rbegin() * 1.3
      << "]\nset xtics (";
    for (auto it = xs.begin(); it != xs.end(); ++it) g << (it == xs.begin() ? "" : ", ") << *it;
    g << ")\n";
    g << "set xlabel " << quoted(p + columns >= panels.size() ? xlabel : "") << "\nset ylabel "
      << quoted(p % columns == 0 ? ylabel : "") << "\n";
    if (p == 0) g << "set key top left font ',9' spacing 0.9 samplen 2.5 box opaque\n";
    else g << "unset key\n";
    g << "unset label\n";
    for (const auto& l : panel.labels)
      g << "set label " << quoted(l.text) << " at " << l.x << "," << l.y << " offset 0,0.9 center font ',9' tc rgb "
        << quoted(l.color) << "\n";
    g << "plot ";
    for (size_t i = 0; i < panel.series.size(); ++i, ++index) {
      const PanelSeries& s = panel.series[i];
      d << "# " << panel.title << ": " << s.data.name << "\n";
      for (auto [x, y] : s.data.points) d << x << " " << y << "\n";
      d << (s.data.points.empty() ? "nan nan\n" : "") << "\n\n";
      g << (i ? ", " : "") << quoted(dat) << " index " << index << " with linespoints lw " << s.width << " dt "
        << (s.dashed ? 2 : 1) << " pt 7 ps " << (s.width > 2 ? 0.8 : 0.5) << " lc rgb " << quoted(s.color)
        << " title " << quoted(s.data.name);
    }
    g << "\n";
  }
  g << "unset multiplot\n";
  d.close();
  g.close();
  if (std::system(fmt::format("gnuplot '{}'", gp).c_str()) != 0)
    return make_status(StatusCode::internal, "gnuplot failed on {}", gp);
  std::filesystem::remove(gp);
  return {};
}

}  // namespace kvstream::bench

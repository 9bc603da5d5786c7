#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

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

}  // namespace kvstream::bench

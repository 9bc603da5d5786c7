// What the attack benchmarks read of a storage node process while they run: its
// resident size from /proc (the peak, sampled every 20 ms on a thread of its own),
// and the percentiles of the victim's latencies.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace kvstream::perf {

/// VmRSS of process `pid` in bytes (0 when it cannot be read).
inline uint64_t rss_bytes(pid_t pid) {
  std::ifstream f(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

/// The `p` quantile of `v` (0 for none).
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

/// Samples a process's RSS every 20 ms from construction until stop() (or
/// destruction), keeping the largest.
class PeakRss {
 public:
  explicit PeakRss(pid_t pid)
      : pid_(pid), thread_([this] {
          while (!stop_) {
            peak_ = std::max(peak_.load(), rss_bytes(pid_));
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
        }) {}
  PeakRss(const PeakRss&) = delete;
  PeakRss& operator=(const PeakRss&) = delete;
  ~PeakRss() { stop(); }

  /// Ends the sampling; returns the peak, a last sample included.
  uint64_t stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    peak_ = std::max(peak_.load(), rss_bytes(pid_));
    return peak_;
  }

 private:
  pid_t pid_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> peak_{0};
  std::thread thread_;
};

}  // namespace kvstream::perf

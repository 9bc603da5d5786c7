// What kvstream logs while one of these lives: a test's sink for the library's log,
// each line with its level. Restores stderr (and the level, where it set one) after.
#pragma once

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvstream/log.hpp"

namespace kvstream::testing {

class LogCapture {
 public:
  using Line = std::pair<LogLevel, std::string>;

  /// Takes the log from now on; `level`: the level in force meanwhile (info after).
  explicit LogCapture(std::optional<LogLevel> level = std::nullopt) : level_(level) {
    if (level_) set_log_level(*level_);
    set_log_sink([this](LogLevel l, std::string_view m) {
      std::lock_guard lock(mu_);
      lines_.emplace_back(l, m);
    });
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  ~LogCapture() {
    set_log_sink({});
    if (level_) set_log_level(LogLevel::info);
  }

  [[nodiscard]] std::vector<Line> lines() const {
    std::lock_guard lock(mu_);
    return lines_;
  }
  /// The texts of the lines at warn or above.
  [[nodiscard]] std::vector<std::string> warnings() const {
    std::vector<std::string> out;
    for (auto& [level, text] : lines())
      if (level >= LogLevel::warn) out.push_back(text);
    return out;
  }

 private:
  const std::optional<LogLevel> level_;
  mutable std::mutex mu_;
  std::vector<Line> lines_;
};

}  // namespace kvstream::testing

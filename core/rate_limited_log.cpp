#include "core/rate_limited_log.hpp"

#include "core/log.hpp"

namespace kvstream::detail {

RateLimitedLog::RateLimitedLog(std::string what, std::chrono::milliseconds interval, Now now)
    : what_(std::move(what)), interval_(interval), now_(std::move(now)) {}

RateLimitedLog::~RateLimitedLog() {
  std::lock_guard lock(mu_);
  flush_locked(now_(), true);
}

bool RateLimitedLog::note(std::string_view detail) {
  std::lock_guard lock(mu_);
  ++total_;
  const auto now = now_();
  bool wrote = flush_locked(now, false);
  if (open_) {
    ++held_;
    return wrote;
  }
  open_ = true;
  window_start_ = now;
  logger().warn("{}: {}", what_, detail);
  ++lines_;
  return true;
}

bool RateLimitedLog::flush() {
  std::lock_guard lock(mu_);
  return flush_locked(now_(), false);
}

bool RateLimitedLog::flush_locked(Clock::time_point now, bool force) {
  if (!open_ || (!force && now - window_start_ < interval_)) return false;
  open_ = false;
  if (held_ == 0) return false;
  const auto secs = std::chrono::duration<double>(now - window_start_).count();
  logger().warn("{}: {} more in the last {:.0f} s ({} in all)", what_, held_, secs, total_);
  held_ = 0;
  ++lines_;
  return true;
}

uint64_t RateLimitedLog::total() const {
  std::lock_guard lock(mu_);
  return total_;
}
uint64_t RateLimitedLog::lines() const {
  std::lock_guard lock(mu_);
  return lines_;
}

}  // namespace kvstream::detail

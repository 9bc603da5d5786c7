// A warning that a hostile peer can trigger at will (a refused connection, a failed
// login) must not let that peer fill the disk with log: such events are counted and
// logged at most once per interval, the first at once and the rest as a count.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

namespace kvstream::detail {

class RateLimitedLog {
 public:
  using Clock = std::chrono::steady_clock;
  using Now = std::function<Clock::time_point()>;
  /// `what` starts every line; `now` is the clock (a fake one in tests).
  RateLimitedLog(std::string what, std::chrono::milliseconds interval, Now now = &Clock::now);
  ~RateLimitedLog();

  /// Counts one event. The first of an interval is logged with its `detail`; the
  /// others only add to the count that the next line reports. Returns whether a line
  /// was written.
  bool note(std::string_view detail);
  /// Writes the count of events held back, once their interval is over (callers
  /// call it now and then). Returns whether a line was written.
  bool flush();

  [[nodiscard]] uint64_t total() const;
  [[nodiscard]] uint64_t lines() const;

 private:
  bool flush_locked(Clock::time_point now, bool force);
  const std::string what_;
  const std::chrono::milliseconds interval_;
  const Now now_;
  mutable std::mutex mu_;
  Clock::time_point window_start_{};
  bool open_ = false;       // an interval has begun (its first event was logged)
  uint64_t held_ = 0;       // events of this interval not logged yet
  uint64_t total_ = 0, lines_ = 0;
};

}  // namespace kvstream::detail

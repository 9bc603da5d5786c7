// Time in tests without the wall clock: a clock the test moves, injected into the
// `now` setting of the part under test (PacedClientConfig, SchedulerConfig,
// RateLimitedLog).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

#include "tests/support/hang_guard.hpp"

namespace kvstream::testing {

/// A steady clock that stands still until the test moves it. Thread-safe. Reads
/// through fn() (the part under test's reads) are counted, so that a test can wait
/// until the part's own thread has looked at the time since the clock last moved.
class FakeClock {
 public:
  using Clock = std::chrono::steady_clock;

  /// Starts at a fixed point (not the real now): what the part computes from it is the
  /// same every run.
  explicit FakeClock(Clock::time_point start = Clock::time_point(1000s)) : now_(start) {}

  /// The time, as the test sees it (not counted as a read).
  [[nodiscard]] Clock::time_point now() const {
    std::lock_guard lk(mu_);
    return now_;
  }
  void set(Clock::time_point t) {
    std::lock_guard lk(mu_);
    now_ = t;
  }
  void advance(Clock::duration d) {
    std::lock_guard lk(mu_);
    now_ += d;
  }

  /// What a part's `now` setting takes: reads the time and counts the read.
  [[nodiscard]] std::function<Clock::time_point()> fn() {
    return [this] {
      std::lock_guard lk(mu_);
      ++reads_;
      cv_.notify_all();
      return now_;
    };
  }

  /// Waits until fn() has been called `n` more times from now on (false after
  /// kHangGuard). A part whose thread reads the clock at the start of each pass over
  /// its work has, after two reads past a move, finished one whole pass at the new
  /// time: what was due by then has been done.
  [[nodiscard]] bool wait_reads(uint64_t n) {
    std::unique_lock lk(mu_);
    const uint64_t until = reads_ + n;
    return cv_.wait_for(lk, kHangGuard, [&] { return reads_ >= until; });
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Clock::time_point now_;
  uint64_t reads_ = 0;
};

}  // namespace kvstream::testing

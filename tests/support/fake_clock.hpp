// Time in tests without the wall clock: a clock the test moves (injected into the
// `now` setting of the part under test), and waits on a condition whose time bound is
// only a hang guard, never what a test asserts.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace kvstream::testing {

using namespace std::chrono_literals;

/// How long a wait on something that must happen may take before the test gives up:
/// far beyond any loaded sanitizer run, so reaching it means a hang (a bug), not a
/// slow machine.
inline constexpr std::chrono::seconds kHangGuard{60};

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

/// Polls `pred` until it holds; false if it still does not after kHangGuard. For
/// what another thread or process does on its own time (a node noticing a closed
/// connection); the bound is a hang guard only.
template <typename Pred>
[[nodiscard]] bool eventually(Pred&& pred) {
  const auto give_up = std::chrono::steady_clock::now() + kHangGuard;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= give_up) return pred();
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace kvstream::testing

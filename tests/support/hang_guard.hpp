// Waits on something that must happen, in tests: the time bound is a hang guard,
// never what a test asserts (a test asserts the condition, an order or a count).
#pragma once

#include <chrono>
#include <thread>

namespace kvstream::testing {

using namespace std::chrono_literals;

/// How long a wait on something that must happen may take before the test gives up:
/// far beyond any loaded sanitizer run, so reaching it means a hang (a bug), not a
/// slow machine.
inline constexpr std::chrono::seconds kHangGuard{60};

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

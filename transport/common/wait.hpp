// The deadline and cancel rules every blocking transport call follows, and the
// backoff of a backend that polls for completions. A backend's engine decides how it
// waits (UCX sleeps on its worker's event fd, tcp on its ring); what stops a wait and
// what the caller is told is the same in all of them.
#pragma once

#include <chrono>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>

#include "kvstream/transport.hpp"

namespace kvstream::transport {

/// Why a wait must end now: cancelled (the token was cancelled) or timed_out (the
/// deadline passed), in that order; ok when it may go on. `who` and `what` name the
/// wait in the message ("tcp 127.0.0.1:7471", "recv_body").
inline Status wait_verdict(Deadline deadline, const CancelToken* cancel, std::string_view who, std::string_view what,
                           Clock::time_point now = Clock::now()) {
  if (cancel && cancel->cancelled()) return make_status(StatusCode::cancelled, "{} {}: cancelled", who, what);
  if (now >= deadline) return make_status(StatusCode::timed_out, "{} {}: deadline passed", who, what);
  return {};
}

/// Backoff for a polling loop that found nothing to do: yields at first (a
/// completion is usually microseconds away), then sleeps 20 us, then 200 us, so an
/// idle wait costs little CPU while a busy one keeps its latency.
class Backoff {
 public:
  void pause() {
    using namespace std::chrono_literals;
    if (idle_ == 0) idle_since_ = std::chrono::steady_clock::now();
    if (idle_ < 64) std::this_thread::yield();
    else if (idle_ < 2000) std::this_thread::sleep_for(20us);
    else std::this_thread::sleep_for(200us);
    ++idle_;
  }
  /// Progress was made: the next pause yields again.
  void reset() noexcept { idle_ = 0; }
  /// Idle (pausing since the last reset) for at least `d`. A backend that can block
  /// on an event and be woken by it does so after a while instead of sleeping between
  /// polls: not at once, since the hand-off through the waking thread costs more than
  /// a poll that finds a completion microseconds away.
  [[nodiscard]] bool idle_for(std::chrono::steady_clock::duration d) const noexcept {
    return idle_ > 0 && std::chrono::steady_clock::now() - idle_since_ >= d;
  }

 private:
  int idle_ = 0;
  std::chrono::steady_clock::time_point idle_since_{};
};

/// Polls until `step` returns a verdict, the deadline passes or `cancel` fires.
/// `step()` makes progress and returns std::nullopt to go on, or the result; `moved`
/// says whether it made progress (resets the backoff). Where the loop would pause,
/// `block(backoff)` may wait on an event itself instead and return true; false takes
/// the backoff's pause.
template <typename Step, typename Block>
Status poll_until(Step&& step, Deadline deadline, const CancelToken* cancel, std::string_view who,
                  std::string_view what, Block&& block) {
  Backoff backoff;
  for (;;) {
    bool moved = false;
    if (std::optional<Status> done = step(moved)) return *std::move(done);
    KVS_RETURN_IF_ERROR(wait_verdict(deadline, cancel, who, what));
    if (moved) backoff.reset();
    else if (!block(std::as_const(backoff))) backoff.pause();
  }
}

/// poll_until that only ever pauses between polls.
template <typename Step>
Status poll_until(Step&& step, Deadline deadline, const CancelToken* cancel, std::string_view who,
                  std::string_view what) {
  return poll_until(std::forward<Step>(step), deadline, cancel, who, what, [](const Backoff&) { return false; });
}

}  // namespace kvstream::transport

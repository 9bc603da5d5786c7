// A warning said while a wait lasts: once it has lasted `every`, and again each
// `every` after (a fenced node's trim waiting on other members, Rebalancer). The
// times come from the caller, so the rhythm is tested on a clock of the test's own.
#pragma once

#include <optional>

#include "kvstream/transport.hpp"

namespace kvstream::cluster {

class WaitWarning {
 public:
  explicit WaitWarning(transport::Clock::duration every) : every_(every) {}

  /// The wait goes on at `now` (the first call starts it): how long it has lasted
  /// when a warning is due, else none.
  [[nodiscard]] std::optional<transport::Clock::duration> waiting(transport::Clock::time_point now) {
    if (!since_) {
      since_ = now, said_at_ = now;
      return std::nullopt;
    }
    if (now - said_at_ < every_) return std::nullopt;
    said_at_ = now;
    return now - *since_;
  }

  /// The wait ended: the next call to waiting() starts a new one.
  void ended() { since_.reset(); }

 private:
  const transport::Clock::duration every_;
  std::optional<transport::Clock::time_point> since_;
  transport::Clock::time_point said_at_{};
};

}  // namespace kvstream::cluster

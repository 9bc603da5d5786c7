// An error the peer caused, and who logs it. On a connection this side opened, the
// peer is a server we chose: its faults are news, logged where they are found, like
// any error. On a connection a listener accepted, the peer is whoever connected, and
// the errors it can cause at will (its framing, its records, a handshake it never
// finishes, how it closes or resets) would write one line per attempt: a flood of
// them must not fill the log. So on that side they are logged at debug, and the
// listener's owner logs what it is given (a node through its rate-limited logs).
// Every backend decides this here, from the side the connection knows it is on.
#pragma once

#include <cstdint>
#include <utility>

#include "core/log.hpp"
#include "kvstream/status.hpp"

namespace kvstream::transport {

/// Which side opened a connection.
enum class Side : uint8_t { connected, accepted };

/// `why` (built unlogged), logged as `side` calls for, and returned.
inline Status peer_fault(Side side, Status why) {
  if (side == Side::accepted)
    KVS_LOG_DEBUG("{}", why.to_string());
  else
    detail::log_new_error(why);
  return why;
}

template <typename... Args>
Status peer_fault(Side side, StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return peer_fault(side, detail::unlogged_status(code, f, std::forward<Args>(args)...));
}

/// The level for a line about a peer's fault that is not a Status (a completion's
/// error, a connection marked failed).
inline spdlog::level::level_enum peer_fault_level(Side side) {
  return side == Side::accepted ? spdlog::level::debug : spdlog::level::warn;
}

}  // namespace kvstream::transport

// A peer that closed its side between two messages. For a node that is a client
// going away, the end of an ordinary conversation; only a caller that was waiting for
// a reply finds it an error, and says so with what was lost (the storage client's
// "connection lost with N requests in flight"). So the backends log it at debug, as
// UCX's endpoint error callback does. A close inside a message stays a warning where
// it is seen: the framing broke.
#pragma once

#include <string>

#include "core/log.hpp"
#include "kvstream/status.hpp"

namespace kvstream::transport {

/// `unavailable` with `message`, logged at debug only.
inline Status peer_closed(std::string message) {
  KVS_LOG_DEBUG("unavailable: {}", message);
  return Status(StatusCode::unavailable, std::move(message));
}

}  // namespace kvstream::transport

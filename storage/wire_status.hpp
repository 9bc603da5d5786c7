// Status codes as the storage protocol carries them. The wire numbers are fixed here,
// apart from the API's StatusCode, so the API may add, reorder or rename codes
// without changing what peers of another version read (docs/protocol.md lists them).
#pragma once

#include <cstdint>

#include "kvstream/status.hpp"

namespace kvstream::storage {

/// A status code on the wire. Numbers never change; new codes take new numbers.
enum class WireStatus : uint8_t {
  ok = 0,
  invalid_argument = 1,
  out_of_range = 2,
  not_found = 3,
  already_exists = 4,
  corrupt_data = 5,
  unsupported = 6,
  unavailable = 7,
  timed_out = 8,
  cancelled = 9,
  permission_denied = 10,
  io_error = 11,
  resource_exhausted = 12,
  internal = 13,
};

/// The wire number of an API code.
uint8_t to_wire(StatusCode code) noexcept;

/// The API code of a wire number. Errors: corrupt_data for a number no version sends.
Result<StatusCode> from_wire(uint8_t code);

}  // namespace kvstream::storage

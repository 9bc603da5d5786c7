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

/// The response header's byte after the code: a refinement of it that a peer which
/// does not know it reads as the code alone (peers before no_space sent 0 and ignore
/// the byte). So a code the API adds later travels as the nearest old code plus a
/// detail, and older clients keep working with the coarser meaning.
enum class WireDetail : uint8_t {
  none = 0,
  no_space = 1,  // with resource_exhausted: StatusCode::no_space
};

struct WireCode {
  WireStatus code = WireStatus::internal;
  WireDetail detail = WireDetail::none;
};

/// The wire code and detail of an API code.
WireCode to_wire(StatusCode code) noexcept;

/// The API code of a wire number and its detail byte (a detail this build does not
/// know, or one that does not belong to the code, is ignored). Errors: corrupt_data
/// for a number no version sends.
Result<StatusCode> from_wire(uint8_t code, uint8_t detail = 0);

}  // namespace kvstream::storage

#include "storage/wire_status.hpp"

namespace kvstream::storage {

WireCode to_wire(StatusCode code) noexcept {
  WireStatus w = WireStatus::internal;
  switch (code) {
    case StatusCode::ok: w = WireStatus::ok; break;
    case StatusCode::invalid_argument: w = WireStatus::invalid_argument; break;
    case StatusCode::out_of_range: w = WireStatus::out_of_range; break;
    case StatusCode::not_found: w = WireStatus::not_found; break;
    case StatusCode::already_exists: w = WireStatus::already_exists; break;
    case StatusCode::corrupt_data: w = WireStatus::corrupt_data; break;
    case StatusCode::unsupported: w = WireStatus::unsupported; break;
    case StatusCode::unavailable: w = WireStatus::unavailable; break;
    case StatusCode::timed_out: w = WireStatus::timed_out; break;
    case StatusCode::cancelled: w = WireStatus::cancelled; break;
    case StatusCode::permission_denied: w = WireStatus::permission_denied; break;
    case StatusCode::io_error: w = WireStatus::io_error; break;
    case StatusCode::resource_exhausted: w = WireStatus::resource_exhausted; break;
    case StatusCode::internal: w = WireStatus::internal; break;
    case StatusCode::no_space: return {WireStatus::resource_exhausted, WireDetail::no_space};
  }
  return {w, WireDetail::none};
}

Result<StatusCode> from_wire(uint8_t code, uint8_t detail) {
  switch (WireStatus(code)) {
    case WireStatus::ok: return StatusCode::ok;
    case WireStatus::invalid_argument: return StatusCode::invalid_argument;
    case WireStatus::out_of_range: return StatusCode::out_of_range;
    case WireStatus::not_found: return StatusCode::not_found;
    case WireStatus::already_exists: return StatusCode::already_exists;
    case WireStatus::corrupt_data: return StatusCode::corrupt_data;
    case WireStatus::unsupported: return StatusCode::unsupported;
    case WireStatus::unavailable: return StatusCode::unavailable;
    case WireStatus::timed_out: return StatusCode::timed_out;
    case WireStatus::cancelled: return StatusCode::cancelled;
    case WireStatus::permission_denied: return StatusCode::permission_denied;
    case WireStatus::io_error: return StatusCode::io_error;
    case WireStatus::resource_exhausted:
      return WireDetail(detail) == WireDetail::no_space ? StatusCode::no_space : StatusCode::resource_exhausted;
    case WireStatus::internal: return StatusCode::internal;
  }
  return make_status(StatusCode::corrupt_data, "status code {} on the wire", code);
}

}  // namespace kvstream::storage

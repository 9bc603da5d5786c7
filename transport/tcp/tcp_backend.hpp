// The tcp transport backend: framed messages over TCP, driven by io_uring.
//
// Each connection owns two io_urings (one for sends, one for receives) so that one
// thread may send while another receives without the two stealing each other's
// completions; a mutex per direction serialises callers of the same direction.
// Every wait is cut into slices of at most kTcpWaitSlice so a CancelToken is seen
// promptly, and an operation interrupted by a deadline or a cancel is cancelled in
// the kernel and reaped before the call returns (no late write into caller memory).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kvstream/transport.hpp"

namespace kvstream::transport::tcp {

/// Longest single wait on a ring: the latency with which a cancel is noticed.
inline constexpr std::chrono::milliseconds kTcpWaitSlice{50};

/// Internal receive buffer: prefix and header reads are batched through it (many
/// small messages per recv). Body bytes that arrive with a header are copied out of
/// it (at most this much per message); the rest of a body is received straight
/// into the caller's memory.
inline constexpr size_t kTcpRxBufferBytes = 32 * 1024;

}  // namespace kvstream::transport::tcp

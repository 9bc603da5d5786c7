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

/// IORING_OP_SENDMSG_ZC for message bodies. Off by default: on loopback it was
/// measured slower than a plain send (the kernel copies loopback zero-copy skbs
/// anyway and the extra notification costs a completion per send); see
/// docs/wire-tcp.md for the numbers.
inline constexpr bool kTcpSendZcDefault = false;
/// Bodies smaller than this never use zero-copy even when it is on.
inline constexpr size_t kTcpSendZcMinBytes = 64 * 1024;

/// SO_SNDBUF / SO_RCVBUF; 0 leaves the kernel's autotuning alone (which on Linux
/// grows to tcp_wmem/tcp_rmem max, more than a fixed SO_*BUF capped at
/// wmem_max/rmem_max would give).
inline constexpr int kTcpSocketBufferBytes = 0;

/// Tunables of the tcp backend beyond BackendConfig (tests and benchmarks).
struct TcpOptions {
  bool send_zc = kTcpSendZcDefault;
  size_t send_zc_min_bytes = kTcpSendZcMinBytes;
  int socket_buffer_bytes = kTcpSocketBufferBytes;
};

/// make_tcp_backend with explicit options (make_tcp_backend uses the defaults).
Result<std::unique_ptr<Backend>> make_tcp_backend_with(const BackendConfig& config, const TcpOptions& options);

}  // namespace kvstream::transport::tcp

// The byte stream of one Redis connection, in clear or through TLS, every wait
// bounded by the caller's deadline. hiredis 0.14 (Debian 12) has no TLS and owns its
// socket, so the Redis clients drive the socket here and keep hiredis for the RESP
// reply parser only (redis_conn.cpp). Internal to the Redis clients.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvstream/status.hpp"
#include "kvstream/transport.hpp"
#include "security/tls_context.hpp"

namespace kvstream::redis::detail {

class RedisSocket {
 public:
  /// Connects to `address` ("host:port" or "unix:/path") and, when `tls` is set,
  /// runs the TLS handshake (the server's certificate is verified against the
  /// context's trust, and must name the host connected to or tls.server_name).
  /// Errors (not logged: the caller words and logs them): invalid_argument (TLS over
  /// a Unix socket), unavailable (unknown host, refused, closed), timed_out,
  /// permission_denied (a certificate refused either way), corrupt_data (the peer
  /// does not speak TLS), io_error.
  static Result<std::unique_ptr<RedisSocket>> open(const std::string& address, const security::TlsContext* tls,
                                                   transport::Deadline deadline);
  ~RedisSocket();
  RedisSocket(const RedisSocket&) = delete;
  RedisSocket& operator=(const RedisSocket&) = delete;

  /// Writes every byte of `pieces`, in order. Errors: timed_out, unavailable (the
  /// server closed or reset the connection), corrupt_data, io_error. After an error
  /// the stream is unusable (part of a command may be on the wire).
  Status write_all(std::span<const std::span<const char>> pieces, transport::Deadline deadline);
  /// Reads at least one byte into `buf` (as many as are ready). Errors: as write_all.
  Result<size_t> read_some(std::span<char> buf, transport::Deadline deadline);

  [[nodiscard]] bool tls() const { return ssl_ != nullptr; }

 private:
  RedisSocket(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  /// Waits until `events` are ready on the socket. Errors: timed_out, io_error.
  Status wait(short events, transport::Deadline deadline, const char* what);
  /// The error of a failed SSL_read/SSL_write (WANT_* are handled by the caller).
  Status tls_error(int rc, const char* what);

  int fd_ = -1;
  std::string address_;
  security::SslPtr ssl_;
  bool failed_ = false;  // no close_notify on a stream in an unknown state
};

}  // namespace kvstream::redis::detail

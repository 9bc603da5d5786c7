// The server side of TLS on a tcp listener: one thread that accepts sockets and runs
// their handshakes, many at once and non-blocking, and hands out only connections
// whose handshake is done. So a client's connect completes when its handshake does,
// whether or not the server is inside accept() at that moment (as a TCP connect
// completes against the kernel's backlog), and a slow or silent client never holds up
// accept() or another client's handshake.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/rate_limited_log.hpp"
#include "kvstream/transport.hpp"
#include "security/tls_context.hpp"

namespace kvstream::transport::tcp {

/// A handshake not done by then is dropped.
inline constexpr std::chrono::seconds kTlsHandshakeTimeout{10};
/// Handshakes under way at once; a newcomer past it replaces the oldest (a flood of
/// silent sockets cannot lock real clients out for longer than their handshakes take).
inline constexpr size_t kMaxPendingHandshakes = 256;
/// Handshaked connections waiting for accept(); past it, new sockets wait in the
/// kernel's backlog.
inline constexpr size_t kMaxReadyConnections = 256;

class TlsAcceptor {
 public:
  /// `listen_fd` (owned by the caller, made non-blocking here) stays open while this lives.
  TlsAcceptor(int listen_fd, std::shared_ptr<const security::TlsContext> ctx, const TcpSettings& opt,
              std::string address);
  ~TlsAcceptor();
  TlsAcceptor(const TlsAcceptor&) = delete;
  TlsAcceptor& operator=(const TlsAcceptor&) = delete;

  /// Starts the thread. Errors: io_error.
  Status start();

  /// A connected socket (blocking again) whose handshake is done.
  struct Ready {
    int fd = -1;
    sockaddr_storage peer{};
    security::TlsEstablished tls;
  };
  /// The next one by `deadline`. Errors: timed_out, cancelled.
  Result<Ready> next(Deadline deadline, const CancelToken& cancel);

  struct Counters {
    uint64_t handshakes = 0, failed = 0, timed_out = 0, evicted = 0;
  };
  [[nodiscard]] Counters counters() const;

 private:
  struct Pending {
    int fd = -1;
    sockaddr_storage peer{};
    std::string peer_text;
    security::SslPtr ssl;
    std::chrono::steady_clock::time_point started;
    short events = POLLIN;
  };

  void run();
  void accept_new();
  /// Steps `p`'s handshake; true when it left the pending set (done or failed).
  bool step(Pending& p);
  void drop(Pending& p, const Status& why);

  const int listen_fd_;
  const std::shared_ptr<const security::TlsContext> ctx_;
  const TcpSettings opt_;
  const std::string address_;
  int wake_fd_ = -1;
  std::thread thread_;
  std::vector<Pending> pending_;  // the thread's own
  kvstream::detail::RateLimitedLog failures_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Ready> ready_;
  bool stop_ = false;
  Counters counters_;
};

}  // namespace kvstream::transport::tcp

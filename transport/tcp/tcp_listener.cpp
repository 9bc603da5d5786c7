// The tcp listener: a listening socket whose accepts go through an io_uring, so a
// deadline or cancel ends them like any other wait.
#include "transport/tcp/tcp_listener.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "core/log.hpp"
#include "transport/common/address.hpp"
#include "transport/tcp/tcp_connection.hpp"
#include "transport/tcp/tcp_ring.hpp"
#include "transport/tcp/tcp_socket.hpp"
#include "transport/tcp/tls_acceptor.hpp"

namespace kvstream::transport::tcp {
namespace {

class TcpListener final : public Listener {
 public:
  TcpListener(int fd, std::string address, const TcpSettings& opt, unsigned depth,
              std::shared_ptr<const security::TlsContext> tls)
      : fd_(fd), address_(std::move(address)), opt_(opt), depth_(depth), tls_(std::move(tls)) {}
  ~TcpListener() override {
    acceptor_.reset();  // its thread polls fd_
    if (pending_fd_ >= 0) close(pending_fd_);
    close(fd_);
  }

  Status init() {
    if (tls_) {
      acceptor_ = std::make_unique<TlsAcceptor>(fd_, tls_, opt_, address_);
      return acceptor_->start();
    }
    return ring_.init(4);
  }

  Result<std::unique_ptr<Connection>> accept(Deadline deadline, const CancelToken& cancel) override {
    if (acceptor_) return accept_tls(deadline, cancel);
    std::lock_guard lock(mu_);
    int cfd = -1;
    sockaddr_storage peer{};
    if (pending_fd_ >= 0) {  // accepted by an earlier call just as its wait ended
      cfd = pending_fd_;
      peer = pending_peer_;
      pending_fd_ = -1;
    } else {
      if (cancel.cancelled()) return make_status(StatusCode::cancelled, "tcp accept on {}: cancelled", address_);
      socklen_t len = sizeof peer;
      io_uring_sqe* s = ring_.sqe();
      const uint64_t id = ring_.next_id();
      io_uring_prep_accept(s, fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
      io_uring_sqe_set_data64(s, id);
      int res = 0;
      bool got = false;
      Status st = await_op(ring_, fd_, id, deadline, cancel, res, got);
      if (!st.ok()) {
        if (got && res >= 0) {  // a connection arrived as we gave up: keep it for the next call
          pending_fd_ = res;
          pending_peer_ = peer;
        }
        return st.with_context(fmt::format("tcp accept on {}", address_));
      }
      if (res < 0) return make_status(code_for_errno(-res), "tcp accept on {}: {}", address_, errno_text(-res));
      cfd = res;
    }
    configure_socket(cfd, opt_);
    auto conn = std::make_unique<TcpConnection>(cfd, format_address(peer), opt_, Side::accepted);
    if (Status st = conn->init(depth_); !st.ok()) return st;
    return std::unique_ptr<Connection>(std::move(conn));
  }

  // A connection whose handshake the acceptor's thread completed.
  Result<std::unique_ptr<Connection>> accept_tls(Deadline deadline, const CancelToken& cancel) {
    KVS_ASSIGN_OR_RETURN(auto ready, acceptor_->next(deadline, cancel));
    auto conn =
        std::make_unique<TcpConnection>(ready.fd, format_address(ready.peer), opt_, Side::accepted);
    KVS_RETURN_IF_ERROR(conn->init(depth_));
    KVS_RETURN_IF_ERROR(conn->use_tls(std::move(ready.tls), tls_->settings().kernel_tls));
    return std::unique_ptr<Connection>(std::move(conn));
  }

  [[nodiscard]] std::string address() const override { return address_; }

 private:
  const int fd_;
  const std::string address_;
  const TcpSettings opt_;
  const unsigned depth_;
  const std::shared_ptr<const security::TlsContext> tls_;
  std::unique_ptr<TlsAcceptor> acceptor_;  ///< with TLS: accepts and runs handshakes
  std::mutex mu_;
  Ring ring_;
  int pending_fd_ = -1;
  sockaddr_storage pending_peer_{};
};

}  // namespace

Result<std::unique_ptr<Listener>> listen_tcp(const std::string& address, const TcpSettings& opt, unsigned depth,
                                             std::shared_ptr<const security::TlsContext> tls) {
  auto resolved = resolve_address("tcp", address, true);
  if (!resolved.ok()) return resolved.status();
  const std::vector<sockaddr_storage>& addrs = *resolved;
  Status last;
  for (const sockaddr_storage& a : addrs) {
    // Accepted sockets inherit the buffer sizes open_socket sets.
    auto opened = open_socket(a, opt, "listen on", address);
    if (!opened.ok()) {
      last = opened.status();
      continue;
    }
    const int fd = *opened;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, reinterpret_cast<const sockaddr*>(&a), sockaddr_len(a)) != 0 || ::listen(fd, 512) != 0) {
      const int err = errno;
      last = make_status(err == EADDRINUSE || err == EACCES || err == EADDRNOTAVAIL ? StatusCode::unavailable
                                                                                      : StatusCode::io_error,
                         "tcp listen on {}: {}", address, errno_text(err));
      close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    auto l = std::make_unique<TcpListener>(fd, format_address(bound), opt, depth, tls);
    if (Status st = l->init(); !st.ok()) return st;
    if (tls) {
      KVS_LOG_DEBUG("tcp: listening on {} (TLS 1.3)", l->address());
    } else if (is_loopback(bound)) {
      KVS_LOG_DEBUG("tcp: listening on {} in clear text (loopback)", l->address());
    } else {
      KVS_LOG_WARN("tcp: listening on {} in clear text: anyone on the path sees every chunk (set tcp.tls.*)",
                   l->address());
    }
    return std::unique_ptr<Listener>(std::move(l));
  }
  return last;
}

}  // namespace kvstream::transport::tcp

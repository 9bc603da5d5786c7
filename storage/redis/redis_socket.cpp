#include "storage/redis/redis_socket.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "security/socket_bio.hpp"
#include "transport/common/address.hpp"

namespace kvstream::redis::detail {

using transport::Clock;
using transport::Deadline;

namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

// Milliseconds poll() may wait for `deadline`, rounded up so it never spins, or -1
// when it has passed.
int poll_ms(Deadline deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return -1;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1;
  return int(std::min<long long>(ms, 1 << 30));
}

// A non-blocking connect to `sa`, finished within the deadline.
Status connect_one(int fd, const sockaddr* sa, socklen_t len, Deadline deadline) {
  if (::connect(fd, sa, len) == 0) return {};
  if (errno != EINPROGRESS) return Status(StatusCode::unavailable, std::strerror(errno));
  for (;;) {
    const int ms = poll_ms(deadline);
    if (ms < 0) return Status(StatusCode::timed_out, "connect timed out");
    pollfd p{fd, POLLOUT, 0};
    const int n = ::poll(&p, 1, ms);
    if (n < 0 && errno != EINTR) return Status(StatusCode::io_error, fmt::format("poll: {}", std::strerror(errno)));
    if (n > 0) break;
  }
  int err = 0;
  socklen_t err_len = sizeof err;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0) err = errno;
  return err == 0 ? Status() : Status(StatusCode::unavailable, std::strerror(err));
}

Result<int> connect_unix(const std::string& path, Deadline deadline) {
  sockaddr_un sa{};
  if (path.empty() || path.size() >= sizeof sa.sun_path)
    return Status(StatusCode::invalid_argument, fmt::format("bad unix socket path '{}'", path));
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.data(), path.size());
  Fd fd{::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
  if (fd.fd < 0) return Status(StatusCode::io_error, fmt::format("socket: {}", std::strerror(errno)));
  KVS_RETURN_IF_ERROR(connect_one(fd.fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa, deadline));
  return fd.release();
}

// Each address the host resolves to in turn, as hiredis did.
Result<int> connect_tcp(const std::string& address, Deadline deadline) {
  auto addrs = transport::resolve_address("redis", address, false);
  // A name that does not resolve now may later (DNS): a peer unavailable, not a bad
  // argument that would end a cluster call at once.
  if (!addrs.ok()) return Status(StatusCode::unavailable, addrs.status().message());
  Status last(StatusCode::unavailable, "no address");
  for (const auto& ss : *addrs) {
    Fd fd{::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
    if (fd.fd < 0) {
      last = Status(StatusCode::io_error, fmt::format("socket: {}", std::strerror(errno)));
      continue;
    }
    last = connect_one(fd.fd, reinterpret_cast<const sockaddr*>(&ss), transport::sockaddr_len(ss), deadline);
    if (last.ok()) {
      const int one = 1;  // commands are small and answered one round trip at a time
      ::setsockopt(fd.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd.release();
    }
    if (last.code() == StatusCode::timed_out) break;
  }
  return last;
}

bool closed_errno(int e) { return e == ECONNRESET || e == EPIPE || e == ECONNABORTED || e == ENOTCONN; }

}  // namespace

Result<std::unique_ptr<RedisSocket>> RedisSocket::open(const std::string& address, const security::TlsContext* tls,
                                                       Deadline deadline) {
  const bool unix_socket = address.rfind("unix:", 0) == 0;
  if (unix_socket && tls)
    return Status(StatusCode::invalid_argument, "TLS over a Unix socket (Redis serves TLS on TCP only)");
  KVS_ASSIGN_OR_RETURN(int fd, unix_socket ? connect_unix(address.substr(5), deadline) : connect_tcp(address, deadline));
  std::unique_ptr<RedisSocket> s(new RedisSocket(fd, address));
  if (!tls) return s;
  std::string host;
  uint16_t port = 0;
  KVS_RETURN_IF_ERROR(transport::parse_host_port(address, host, port));
  KVS_ASSIGN_OR_RETURN(s->ssl_, tls->new_session(host));
  KVS_RETURN_IF_ERROR(security::attach_socket(s->ssl_.get(), fd));  // no SIGPIPE when Redis resets
  if (Status h = security::run_handshake(s->ssl_.get(), fd, deadline, {}, address); !h.ok()) {
    s->failed_ = true;
    return h;
  }
  return s;
}

RedisSocket::~RedisSocket() {
  // A close_notify, sent if the socket takes it now; Redis needs none.
  if (ssl_ && !failed_) {
    ERR_clear_error();
    (void)SSL_shutdown(ssl_.get());
    ERR_clear_error();
  }
  ssl_.reset();
  if (fd_ >= 0) ::close(fd_);
}

Status RedisSocket::wait(short events, Deadline deadline, const char* what) {
  for (;;) {
    const int ms = poll_ms(deadline);
    if (ms < 0) return Status(StatusCode::timed_out, fmt::format("{}: timed out", what));
    pollfd p{fd_, events, 0};
    const int n = ::poll(&p, 1, ms);
    if (n > 0) return {};  // ready, or an error the next call reports
    if (n < 0 && errno != EINTR) return Status(StatusCode::io_error, fmt::format("{}: poll: {}", what, std::strerror(errno)));
  }
}

Status RedisSocket::tls_error(int rc, const char* what) {
  const int err = SSL_get_error(ssl_.get(), rc);
  if (err == SSL_ERROR_ZERO_RETURN)
    return Status(StatusCode::unavailable, fmt::format("{}: the server closed the TLS session", what));
  if (err == SSL_ERROR_SYSCALL) {
    const int e = errno;
    const std::string queued = security::openssl_errors();
    if (e == 0 || closed_errno(e))
      return Status(StatusCode::unavailable,
                    fmt::format("{}: the server closed the connection ({})", what, e ? std::strerror(e) : "end of stream"));
    return Status(StatusCode::io_error, fmt::format("{}: {} ({})", what, std::strerror(e), queued));
  }
  // In TLS 1.3 the server checks our certificate after our side of the handshake is
  // done: its refusal arrives as an alert on the first read.
  const std::string why = security::openssl_errors();
  const bool refused = why.find("certificate") != std::string::npos || why.find("unknown ca") != std::string::npos ||
                       why.find("access denied") != std::string::npos;
  return Status(refused ? StatusCode::permission_denied : StatusCode::corrupt_data,
                fmt::format("{}: tls: {}", what, why));
}

Status RedisSocket::write_all(std::span<const std::span<const char>> pieces, Deadline deadline) {
  Status s;
  if (!ssl_) {
    // One sendmsg over every piece: a large value goes from the caller's memory.
    size_t first = 0, off = 0;
    while (first < pieces.size()) {
      iovec iov[64];
      size_t n_iov = 0;
      for (size_t i = first; i < pieces.size() && n_iov < 64; ++i) {
        const size_t skip = i == first ? off : 0;
        if (pieces[i].size() > skip)
          iov[n_iov++] = {const_cast<char*>(pieces[i].data() + skip), pieces[i].size() - skip};
      }
      if (n_iov == 0) break;
      msghdr m{};
      m.msg_iov = iov, m.msg_iovlen = n_iov;
      ssize_t n = ::sendmsg(fd_, &m, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (s = wait(POLLOUT, deadline, "send"); !s.ok()) break;
          continue;
        }
        s = Status(closed_errno(errno) ? StatusCode::unavailable : StatusCode::io_error,
                   fmt::format("send: {}", std::strerror(errno)));
        break;
      }
      for (size_t left = size_t(n); first < pieces.size();) {  // advance past what went
        const size_t rest = pieces[first].size() - off;
        if (left < rest) {
          off += left;
          break;
        }
        left -= rest, off = 0, ++first;
      }
    }
  } else {
    for (auto piece : pieces) {
      while (!piece.empty() && s.ok()) {
        ERR_clear_error();
        size_t n = 0;
        // Not partial-write mode: a retry repeats the same buffer, and success means
        // all of it went.
        const int rc = SSL_write_ex(ssl_.get(), piece.data(), piece.size(), &n);
        if (rc == 1) {
          piece = piece.subspan(n);
          continue;
        }
        const int err = SSL_get_error(ssl_.get(), rc);
        if (err == SSL_ERROR_WANT_WRITE || err == SSL_ERROR_WANT_READ)
          s = wait(err == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN, deadline, "send");
        else
          s = tls_error(rc, "send");
        // A server that refused us (our certificate, in TLS 1.3 checked after our
        // side of the handshake) sent an alert and closed: the alert, still to be
        // read, says why better than the reset our write met.
        if (s.code() == StatusCode::unavailable) {
          ERR_clear_error();
          char scrap[512];
          size_t got = 0;
          const int r = SSL_read_ex(ssl_.get(), scrap, sizeof scrap, &got);
          if (r != 1 && SSL_get_error(ssl_.get(), r) == SSL_ERROR_SSL) s = tls_error(r, "send");
        }
      }
      if (!s.ok()) break;
    }
  }
  if (!s.ok()) failed_ = true;
  return s;
}

Result<size_t> RedisSocket::read_some(std::span<char> buf, Deadline deadline) {
  Status s;
  for (;;) {
    if (!ssl_) {
      const ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
      if (n > 0) return size_t(n);
      if (n == 0) {
        s = Status(StatusCode::unavailable, "reply: the server closed the connection");
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (s = wait(POLLIN, deadline, "reply"); s.ok()) continue;
      } else {
        s = Status(closed_errno(errno) ? StatusCode::unavailable : StatusCode::io_error,
                   fmt::format("reply: {}", std::strerror(errno)));
      }
    } else {
      ERR_clear_error();
      size_t n = 0;
      const int rc = SSL_read_ex(ssl_.get(), buf.data(), buf.size(), &n);
      if (rc == 1) return n;
      const int err = SSL_get_error(ssl_.get(), rc);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        if (s = wait(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline, "reply"); s.ok()) continue;
      } else {
        s = tls_error(rc, "reply");
      }
    }
    failed_ = true;
    return s;
  }
}

}  // namespace kvstream::redis::detail

#include "transport/tcp/tls_acceptor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/log.hpp"
#include "security/socket_bio.hpp"
#include "transport/common/address.hpp"
#include "transport/tcp/tcp_ring.hpp"
#include "transport/tcp/tcp_socket.hpp"

namespace kvstream::transport::tcp {

TlsAcceptor::TlsAcceptor(int listen_fd, std::shared_ptr<const security::TlsContext> ctx, const TcpSettings& opt,
                         std::string address)
    : listen_fd_(listen_fd),
      ctx_(std::move(ctx)),
      opt_(opt),
      address_(std::move(address)),
      failures_(fmt::format("tcp listener {} refused a TLS handshake", address_), std::chrono::seconds(10)) {}

TlsAcceptor::~TlsAcceptor() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  for (auto& p : pending_) ::close(p.fd);
  for (auto& r : ready_) ::close(r.fd);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Status TlsAcceptor::start() {
  const int flags = fcntl(listen_fd_, F_GETFL);
  if (flags < 0 || fcntl(listen_fd_, F_SETFL, flags | O_NONBLOCK) < 0)
    return make_status(StatusCode::io_error, "tcp listen on {}: fcntl: {}", address_, errno_text(errno));
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return make_status(StatusCode::io_error, "tcp listen on {}: eventfd: {}", address_, errno_text(errno));
  thread_ = std::thread([this] { run(); });
  return {};
}

Result<TlsAcceptor::Ready> TlsAcceptor::next(Deadline deadline, const CancelToken& cancel) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (!ready_.empty()) {
      Ready r = std::move(ready_.front());
      ready_.pop_front();
      lock.unlock();
      const uint64_t one = 1;  // room again: the thread may accept more
      (void)!::write(wake_fd_, &one, sizeof one);
      return r;
    }
    if (cancel.cancelled()) return make_status(StatusCode::cancelled, "tcp accept on {}: cancelled", address_);
    const auto now = Clock::now();
    if (now >= deadline) return make_status(StatusCode::timed_out, "tcp accept on {}: deadline passed", address_);
    // Sliced, so a cancel is seen promptly.
    cv_.wait_until(lock, std::min(deadline, now + kTcpWaitSlice));
  }
}

TlsAcceptor::Counters TlsAcceptor::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

void TlsAcceptor::run() {
  std::vector<pollfd> fds;
  for (;;) {
    bool room = false;
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      room = ready_.size() < kMaxReadyConnections;
    }
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({room ? listen_fd_ : -1, POLLIN, 0});  // a negative fd is ignored by poll
    for (const auto& p : pending_) fds.push_back({p.fd, p.events, 0});
    const int n = ::poll(fds.data(), fds.size(), 100);
    if (n < 0 && errno != EINTR) {
      KVS_LOG_ERROR("tcp listener {}: poll failed: {}; TLS handshakes stop", address_, errno_text(errno));
      return;
    }
    if (fds[0].revents) {
      uint64_t v;
      (void)!::read(wake_fd_, &v, sizeof v);
    }
    // Step the sockets that are ready (indices shift as they leave: walk backwards).
    for (size_t i = pending_.size(); i-- > 0;) {
      const short rev = fds[i + 2].revents;
      if (rev == 0) continue;
      if (step(pending_[i])) pending_.erase(pending_.begin() + ptrdiff_t(i));
    }
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = pending_.size(); i-- > 0;) {
      if (now - pending_[i].started < kTlsHandshakeTimeout) continue;
      {
        std::lock_guard lock(mu_);
        ++counters_.timed_out;
      }
      drop(pending_[i], make_status(StatusCode::timed_out, "tls handshake with {}: not done in {} s",
                                    pending_[i].peer_text, kTlsHandshakeTimeout.count()));
      pending_.erase(pending_.begin() + ptrdiff_t(i));
    }
    if (room && fds[1].revents) accept_new();
    failures_.flush();
  }
}

void TlsAcceptor::accept_new() {
  for (;;) {
    Pending p;
    socklen_t len = sizeof p.peer;
    p.fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&p.peer), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (p.fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
        failures_.note(fmt::format("accept: {}", errno_text(errno)));
      return;
    }
    configure_socket(p.fd, opt_);
    p.peer_text = format_address(p.peer);
    p.started = std::chrono::steady_clock::now();
    auto ssl = ctx_->new_session({});
    // Not SSL_set_fd: a client that leaves mid-handshake must not raise SIGPIPE here.
    Status attached = ssl.ok() ? security::attach_socket(ssl->get(), p.fd) : ssl.status();
    if (!attached.ok()) {
      drop(p, attached);
      continue;
    }
    p.ssl = std::move(ssl).value();
    if (pending_.size() >= kMaxPendingHandshakes) {
      auto oldest = std::min_element(pending_.begin(), pending_.end(),
                                     [](const Pending& a, const Pending& b) { return a.started < b.started; });
      {
        std::lock_guard lock(mu_);
        ++counters_.evicted;
      }
      drop(*oldest, detail::unlogged_status(StatusCode::resource_exhausted,
                                            "tls handshake with {}: replaced by a newer one", oldest->peer_text));
      pending_.erase(oldest);
    }
    // The client speaks first; its hello is often already there.
    if (!step(p)) pending_.push_back(std::move(p));
  }
}

bool TlsAcceptor::step(Pending& p) {
  const security::HandshakeStep s = security::step_handshake(p.ssl.get(), p.peer_text);
  if (!s.error.ok()) {
    {
      std::lock_guard lock(mu_);
      ++counters_.failed;
    }
    drop(p, s.error);
    return true;
  }
  if (!s.done) {
    p.events = s.wait_events;
    return false;
  }
  auto tls = security::finish_handshake(p.ssl.get(), security::TlsRole::server);
  p.ssl.reset();
  if (!tls.ok()) {
    drop(p, tls.status());
    return true;
  }
  const int flags = fcntl(p.fd, F_GETFL);
  if (flags >= 0) fcntl(p.fd, F_SETFL, flags & ~O_NONBLOCK);  // io_uring's sends wait for room
  {
    std::lock_guard lock(mu_);
    ++counters_.handshakes;
    ready_.push_back(Ready{p.fd, p.peer, std::move(tls).value()});
  }
  p.fd = -1;
  cv_.notify_one();
  return true;
}

void TlsAcceptor::drop(Pending& p, const Status& why) {
  // A peer can cause these at will: rate-limited, with counts.
  failures_.note(why.to_string());
  if (p.fd >= 0) ::close(p.fd);
  p.fd = -1;
}

}  // namespace kvstream::transport::tcp

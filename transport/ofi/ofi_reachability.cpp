// Whether anything listens at a libfabric peer's address: see ofi_reachability.hpp.
#include "transport/ofi/ofi_reachability.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.hpp"

namespace kvstream::transport::ofi {

std::optional<ListenerCheck> ListenerCheck::of(const std::string& provider, const void* addr, size_t len,
                                               std::string address) {
  const std::string core = provider.substr(0, provider.find(';'));
  if (core != "tcp" && core != "sockets") return std::nullopt;
  const auto* sa = static_cast<const sockaddr*>(addr);
  if (!sa || len < sizeof(sa_family_t) || len > sizeof(sockaddr_storage) ||
      (sa->sa_family != AF_INET && sa->sa_family != AF_INET6))
    return std::nullopt;
  ListenerCheck c;
  std::memcpy(&c.addr_, addr, len);
  c.len_ = socklen_t(len);
  c.address_ = std::move(address);
  return c;
}

Status ListenerCheck::operator()(Deadline until) const {
  until = std::min(until, Clock::now() + kListenerCheckAfter);
  const int fd = socket(addr_.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};  // no verdict: the caller waits on
  int err = 0;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr_), len_) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      err = 0;
      pollfd p{fd, POLLOUT, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      if (poll(&p, 1, int(std::max<long long>(left, 0))) == 1) {
        socklen_t n = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &n) != 0) err = 0;
      }
    }
  }
  close(fd);
  // Only the errors that mean nothing will answer at that address give a verdict.
  if (err != ECONNREFUSED && err != EHOSTUNREACH && err != ENETUNREACH) return {};
  KVS_LOG_DEBUG("libfabric: {} did not answer and a TCP connect there failed: {}", address_, std::strerror(err));
  return detail::unlogged_status(StatusCode::unavailable, "nothing listens at {} ({})", address_,
                                 std::strerror(err));
}

}  // namespace kvstream::transport::ofi

// Whether anything listens where a client is saying hello: see ofi_reachability.hpp.
#include "transport/ofi/ofi_reachability.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.hpp"

namespace kvstream::transport::ofi {

bool listens_on_tcp(const std::string& provider) {
  const std::string core = provider.substr(0, provider.find(';'));
  return core == "tcp" || core == "sockets";
}

namespace {

/// The errors of a connect that mean nothing will answer at that address.
bool definite(int err) { return err == ECONNREFUSED || err == EHOSTUNREACH || err == ENETUNREACH; }

Status refused(const std::string& address, int err) {
  return make_status(StatusCode::unavailable, "libfabric: connect to {}: nothing listens there ({})", address,
                     std::strerror(err));
}

}  // namespace

Status check_listener(const void* addr, size_t len, const std::string& address, Deadline until) {
  const auto* sa = static_cast<const sockaddr*>(addr);
  if (!sa || len < sizeof(sa_family_t) || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6)) return {};
  const int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};  // no verdict: the hello goes on to its deadline
  int err = 0;
  if (::connect(fd, sa, socklen_t(len)) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      err = 0;
      pollfd p{fd, POLLOUT, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      if (poll(&p, 1, int(std::clamp<long long>(left, 0, 60'000))) == 1) {
        socklen_t n = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &n) != 0) err = 0;
      }
    }
  }
  close(fd);
  if (!definite(err)) return {};
  KVS_LOG_DEBUG("libfabric: the hello to {} was not taken and a TCP connect there failed: {}", address,
                std::strerror(err));
  return refused(address, err);
}

}  // namespace kvstream::transport::ofi

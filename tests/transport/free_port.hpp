// A loopback TCP port that was free a moment ago (for services a test starts; a
// service that then finds it taken is started again on another), or one held bound.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace kvstream::transport::test_util {

/// A loopback TCP port held bound (not listening) while this lives: a connect there is
/// refused, and no other listener takes it meanwhile.
class BoundPort {
 public:
  BoundPort() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port_ = ntohs(a.sin_port);
  }
  ~BoundPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  BoundPort(const BoundPort&) = delete;
  BoundPort& operator=(const BoundPort&) = delete;
  /// The port; 0 where no socket could be bound.
  [[nodiscard]] uint16_t port() const { return port_; }

 private:
  int fd_;
  uint16_t port_ = 0;
};

inline uint16_t free_port() { return BoundPort().port(); }

}  // namespace kvstream::transport::test_util

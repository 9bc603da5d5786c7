// A storage node's /metrics as a test reads it: one plain HTTP exchange on loopback,
// and a sample's value in the Prometheus text (test_node_metrics.cpp, and the cluster
// tests that watch a node's gauges).
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace kvstream::transport::test_util {

// A TCP connection to "127.0.0.1:port" that sends `request` and reads until the
// peer closes (10 s at most). Empty when it could not connect.
inline std::string http_exchange(const std::string& address, const std::string& request) {
  const uint16_t port = uint16_t(std::stoi(address.substr(address.rfind(':') + 1)));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET, sa.sin_port = htons(port), sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) return ::close(fd), std::string();
  (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, 10000) > 0) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  ::close(fd);
  return got;
}

// The value of the sample `name` (with its labels, as written) in a metrics text; -1 if absent.
inline double sample(const std::string& text, const std::string& name) {
  const std::string at = "\n" + name + " ";
  const size_t i = text.find(at);
  return i == std::string::npos ? -1 : std::stod(text.substr(i + at.size()));
}

}  // namespace kvstream::transport::test_util

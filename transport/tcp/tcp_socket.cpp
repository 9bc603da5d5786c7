// Socket options and errno mapping of the tcp backend.
#include "transport/tcp/tcp_socket.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace kvstream::transport::tcp {

std::string errno_text(int err) { return std::strerror(err); }

StatusCode code_for_errno(int err) {
  switch (err) {
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN:
    case ECONNABORTED:
    case ECONNREFUSED:
    case ESHUTDOWN:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
      return StatusCode::unavailable;
    default:
      return StatusCode::io_error;
  }
}

void configure_socket(int fd, const TcpSettings& opt) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (opt.socket_buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &opt.socket_buffer_bytes, sizeof opt.socket_buffer_bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &opt.socket_buffer_bytes, sizeof opt.socket_buffer_bytes);
  }
}

Result<int> open_socket(const sockaddr_storage& addr, const TcpSettings& opt, std::string_view what,
                        const std::string& address) {
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_status(StatusCode::io_error, "tcp {} {}: socket: {}", what, address, errno_text(errno));
  configure_socket(fd, opt);
  return fd;
}

}  // namespace kvstream::transport::tcp

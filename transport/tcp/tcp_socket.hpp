// The tcp backend's sockets: the options every socket gets from TcpSettings, and
// what a socket error means to the caller.
#pragma once

#include <sys/socket.h>

#include <string>
#include <string_view>

#include "kvstream/status.hpp"
#include "kvstream/transport_config.hpp"

namespace kvstream::transport::tcp {

/// strerror's text for `err`.
std::string errno_text(int err);

/// unavailable for errors that mean "the peer or the path is gone", io_error otherwise.
StatusCode code_for_errno(int err);

/// TCP_NODELAY, and SO_SNDBUF/SO_RCVBUF when `opt` fixes them (a listening socket
/// passes the buffer sizes on to the sockets it accepts). Best effort: a refused
/// option leaves the kernel's default.
void configure_socket(int fd, const TcpSettings& opt);

/// A close-on-exec stream socket of `addr`'s family, configured by `opt`. Errors:
/// io_error naming `what` ("connect to", "listen on") and `address`.
Result<int> open_socket(const sockaddr_storage& addr, const TcpSettings& opt, std::string_view what,
                        const std::string& address);

}  // namespace kvstream::transport::tcp

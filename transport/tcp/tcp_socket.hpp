// The tcp backend's sockets: the options every socket gets from TcpSettings, and
// what a socket error means to the caller.
#pragma once

#include <string>

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

}  // namespace kvstream::transport::tcp

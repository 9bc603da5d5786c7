// The socket under a TLS session. OpenSSL's own socket BIO (SSL_set_fd) writes with
// write(2), and a write to a connection the peer has closed or reset raises SIGPIPE,
// which ends a host process that does not ignore it: a client that sent its
// ClientHello and closed killed a storage node serving TLS within a handful of
// tries. This BIO is that socket BIO with send(MSG_NOSIGNAL), so such a peer is an
// error of its handshake, not a signal.
#pragma once

#include <openssl/ssl.h>

#include "kvstream/status.hpp"

namespace kvstream::security {

/// Reads and writes `ssl`'s records on socket `fd` (which stays the caller's to
/// close), never raising SIGPIPE. Use instead of SSL_set_fd. Errors: internal.
Status attach_socket(SSL* ssl, int fd);

}  // namespace kvstream::security

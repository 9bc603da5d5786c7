// Kernel TLS (kTLS): a direction's TLS 1.3 traffic key handed to the socket, so that
// io_uring's plain sends and receives on it carry TLS records and the data crosses
// user space once, as in clear text. The tcp backend tries it after each handshake
// (TlsSettings::kernel_tls) and falls back to its user-space record layer for a
// direction the kernel refuses.
#pragma once

#include "kvstream/status.hpp"
#include "security/tls_keys.hpp"

namespace kvstream::transport::tcp {

/// Attaches the `tls` upper-layer protocol to a connected socket. Errors:
/// unsupported (this kernel has no tls module: TCP_ULP answers ENOENT), io_error.
Status attach_kernel_tls(int fd);

/// Installs `key` for sending (`send`) or receiving on a socket attach_kernel_tls
/// succeeded on; record sequence numbers start at 0 (nothing was sent or received
/// under the key yet). Errors: unsupported (the kernel lacks the cipher or the
/// direction), io_error.
Status install_kernel_tls(int fd, const security::TrafficKey& key, bool send);

}  // namespace kvstream::transport::tcp

// The listening side of the tcp backend.
#pragma once

#include <memory>
#include <string>

#include "kvstream/transport.hpp"
#include "security/tls_context.hpp"

namespace kvstream::transport::tcp {

/// Listens on `address` ("host:port", port 0 for any), on the first address it
/// resolves to that binds. Accepted connections get `opt` and rings of `depth`
/// entries, and with `tls` a TLS handshake before their first message (server side).
/// Without `tls` on an address other than loopback, a warning says the listener is
/// in clear text. Errors: invalid_argument (bad address), unavailable (in use, not
/// allowed, not local; io_uring unavailable), io_error.
Result<std::unique_ptr<Listener>> listen_tcp(const std::string& address, const TcpSettings& opt, unsigned depth,
                                             std::shared_ptr<const security::TlsContext> tls);

}  // namespace kvstream::transport::tcp

// Accepting UCX connections: a ucp_listener on a socket address whose connection
// requests become connections through the hello handshake.
#pragma once

#include <memory>
#include <string>

#include "kvstream/transport.hpp"
#include "transport/ucx/ucx_engine.hpp"

namespace kvstream::transport::ucx_detail {

/// Listens on "host:port" (port 0: any). Errors: invalid_argument (an address that
/// does not resolve), unavailable (UCX cannot listen there).
Result<std::unique_ptr<Listener>> listen_on(const std::shared_ptr<Engine>& eng, const std::string& address);

}  // namespace kvstream::transport::ucx_detail

// A libfabric listener: one RDM endpoint bound to host:port that keeps a few hello
// receives posted and turns the hellos into connections sharing that endpoint.
#pragma once

#include <memory>
#include <string>

#include "kvstream/transport.hpp"
#include "transport/ofi/ofi_fabric.hpp"

namespace kvstream::transport::ofi {

/// Listens on "host:port" (port 0: a free one, reported by Listener::address).
/// Errors: invalid_argument (bad address), unavailable (the provider cannot bind it).
Result<std::unique_ptr<Listener>> listen_on(const std::shared_ptr<Core>& core, const std::string& address);

}  // namespace kvstream::transport::ofi

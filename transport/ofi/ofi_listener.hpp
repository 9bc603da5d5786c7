// A libfabric listener: one RDM endpoint bound to host:port that keeps a few hello
// receives posted and turns the hellos into connections sharing that endpoint.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "kvstream/transport.hpp"
#include "transport/ofi/ofi_fabric.hpp"

namespace kvstream::transport::ofi {

/// Listens on "host:port" (port 0: a free one, reported by Listener::address).
/// Errors: invalid_argument (bad address), unavailable (the provider cannot bind it).
Result<std::unique_ptr<Listener>> listen_on(const std::shared_ptr<Core>& core, const std::string& address);

/// How many peers the address vector of `listener`'s endpoint holds, after removing
/// those no connection or operation uses any more (Endpoint::peer_count); nullopt
/// for a listener of another backend. What a node keeps per client it ever served.
std::optional<size_t> peers_in_address_vector(Listener& listener);

}  // namespace kvstream::transport::ofi

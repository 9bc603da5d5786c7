// The feature bits a storage node declared in its hello (protocol.hpp, kFeature*), for
// the library's own callers that choose a request by them (a rebalance's look at what
// the other members serve: kFeatureServedOnly).
#pragma once

#include <cstdint>

#include "kvstream/storage.hpp"

namespace kvstream::storage {

/// What the node behind `client` declared on its newest connection; 0 for a client
/// that is not a node's (the replicated, Redis or paced one).
[[nodiscard]] uint64_t node_features(const Client& client);

}  // namespace kvstream::storage

// The storage client a StoreConfig names: one node, a replicated cluster or Redis,
// behind a paced link when asked.
#pragma once

#include <memory>
#include <string>

#include "kvstream/storage.hpp"
#include "kvstream/store_config.hpp"

namespace kvstream::store {

/// Connects by `deadline`. Errors: those of the client's connect.
Result<std::unique_ptr<storage::Client>> connect_storage(const StorageSettings& s, transport::Deadline deadline);
/// The name throughput estimates are kept under for these settings (one per peer).
std::string storage_peer(const StorageSettings& s);

}  // namespace kvstream::store

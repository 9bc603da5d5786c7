// Registrations with the libfabric domain: what gives local descriptors for zero
// copy sends and receives, and the keys a peer's one-sided reads (fi_read) use.
#pragma once

#include <memory>

#include "transport/common/registration.hpp"
#include "transport/ofi/ofi_fabric.hpp"

namespace kvstream::transport::ofi {

/// Registers [data, data + size) with the core's domain (for RMA reads too where the
/// provider grants them) and enters it in the table desc_for looks in. Not cached:
/// the backend keeps the cache. Errors: resource_exhausted.
Result<std::shared_ptr<MemoryRegion::Impl>> register_region(const std::shared_ptr<Core>& core, void* data,
                                                             size_t size, MemoryType type);

}  // namespace kvstream::transport::ofi

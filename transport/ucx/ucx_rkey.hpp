// Registered memory on UCX: a region mapped with ucp_mem_map, whose packed remote key
// a peer unpacks to read it one-sidedly (UcxConnection::read, ucx_rkey.cpp).
#pragma once

#include "kvstream/transport.hpp"
#include "transport/ucx/ucx_engine.hpp"

namespace kvstream::transport::ucx_detail {

/// Maps `size` bytes at `data` (host or cuda memory) with the engine's context, or
/// hands out the live registration of that range. Errors: invalid_argument (an empty
/// or null range), unsupported (cuda memory on a UCX without cuda), resource_exhausted
/// (UCX refused the mapping).
Result<MemoryRegion> register_region(Engine& e, void* data, size_t size, MemoryType type);

}  // namespace kvstream::transport::ucx_detail

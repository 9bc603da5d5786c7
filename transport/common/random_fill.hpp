// Random bits from the kernel, for what a peer must not guess or a restarted peer
// must not repeat (connection ids, keys).
#pragma once

#include <cstddef>

namespace kvstream::transport {

/// Fills `out` from getrandom(2); false where the kernel has none to give.
bool random_fill(void* out, size_t n);

}  // namespace kvstream::transport

// What a cluster node's not_found tells: the get asked a node that does not own the
// chunk under its member set, as of an etcd revision (docs/protocol.md, "Owners").
// The node's client keeps the highest such revision it was told; the replicated
// client compares it with its own set's revision after a get found the chunk nowhere:
// a newer one means its set is behind, so it reads the set again and asks anew.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "kvstream/storage.hpp"

namespace kvstream::storage {

/// Shared by a node's client and its connections (which outlive neither it nor the
/// receivers that set it).
using MembersHint = std::shared_ptr<std::atomic<int64_t>>;

/// Raises `hint` to `revision` (a no-op for 0 or a lower one).
inline void raise_members_hint(std::atomic<int64_t>& hint, int64_t revision) {
  int64_t seen = hint.load(std::memory_order_relaxed);
  while (revision > seen && !hint.compare_exchange_weak(seen, revision, std::memory_order_relaxed)) {
  }
}

/// The highest member-set revision the node behind `client` named in a not_found
/// (0: none, or a client that is not a node's: the replicated, Redis or paced one).
[[nodiscard]] int64_t members_revision_hint(const Client& client);

}  // namespace kvstream::storage

// Which stored chunks go first when the store must shrink (KvStore::evict) or make
// room for a put the storage has no space for (eviction.when_full): the chunks of
// this model and profile, the deepest first, the oldest among equally deep ones. A
// chunk is found only after every chunk before it, so removing a prompt's head first
// would leave its tail stored and unreachable; in this order what stays is whole
// prefixes. Chunks without a record come last: one is either a put cut short or a put
// another store is writing now, and nothing tells which.
#pragma once

#include <string>
#include <unordered_set>
#include <vector>

#include "kvstream/kv_store.hpp"
#include "store/kv_store_impl.hpp"

namespace kvstream::store {

/// One stored chunk as eviction sees it.
struct StoredChunk {
  std::string key;
  uint64_t bytes = 0;         // every level's
  bool has_record = false;    // without one, a put cut short: never found
  uint64_t stored_ms = 0;     // from its record; 0 without one
  uint64_t position = 0;      // its first token's position
};

/// Every stored chunk of this store's model and profile, in eviction order (a list,
/// then a stat and a record read per chunk). Errors: the client's.
Result<std::vector<StoredChunk>> chunks_in_eviction_order(KvStore::Impl& m, transport::Deadline deadline);

/// Removes `chunk` (one already gone counts as removed). Errors: the client's.
Status remove_chunk(KvStore::Impl& m, const StoredChunk& chunk, transport::Deadline deadline);

/// Removes chunks in eviction order, none of `keep` and none without a record (another
/// store's put may be writing it), until `bytes` and `fraction` of all the chunks'
/// bytes are freed, or none is left. For a put the storage had no space for: `keep`
/// holds the put's own chunks.
Result<EvictReport> make_room(KvStore::Impl& m, uint64_t bytes, double fraction,
                              const std::unordered_set<std::string>& keep, transport::Deadline deadline);

}  // namespace kvstream::store

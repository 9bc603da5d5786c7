// Which stored chunks go first when the store must shrink (KvStore::evict) or make
// room for a put the storage has no space for (eviction.when_full): the chunks of
// this model and profile, least recently used first. The store marks a prompt's
// chunks used (Client::touch) each time it stores or fetches them, all with one stamp
// and each with its depth, and among chunks of one stamp the deepest go first: a
// chunk is found only after every chunk before it, and its predecessors carry every
// stamp it carries, so what stays is whole prefixes.
//
// Chunks nobody has marked (stored before marks, or where the storage keeps none:
// nodes from before 2026-12-06) go before marked ones, deepest first, the
// oldest among equally deep ones, by their records. Chunks without a record come last:
// one is either a put cut short or a put another store is writing now, and nothing
// tells which.
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
  uint64_t bytes = 0;          // every level's
  bool has_record = false;     // without one, a put cut short: never found
  bool marked = false;         // a use mark (Client::touch) is stored with it
  uint64_t last_used_us = 0;   // its mark's stamp (us), or without one its record's time (0: neither)
  uint64_t depth = 0;          // its mark's depth, or without one its record's position in chunks
};

/// Every stored chunk of this store's model and profile, in eviction order: one usage
/// listing and a record read per unmarked chunk, or where the storage lists no usage, a
/// list, then a stat and a record read per chunk. Errors: the client's.
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

// Surplus copies: the copies a node holds of chunks it no longer owns, left behind
// when a membership change gave the chunks new owners, and the writes a client with an
// older member set made to old owners only. Once every member has finished copying for
// the new set, a node drops such a copy if each owner holds the same write or a newer
// one (ChunkStat::level_versions); an owner that lacks it or holds an older write is
// sent it first, so no write is lost and readers find the newest at its owners
// (docs/storage-backends.md, "Surplus copies").
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvstream/storage.hpp"

namespace kvstream::cluster {

/// What one owner holds of the write a surplus copy is.
enum class OwnerHolds {
  same_or_newer,  ///< that write or a newer one
  none,           ///< no copy of that level (never copied to it, evicted, removed)
  older,          ///< an older write: this one reached only non-owners
  unsaid,         ///< a copy whose version the owner does not say (a node from before versions)
};

/// What the owner whose stat of the context is `stats` (empty: it holds none of it)
/// holds of level `level` of chunk `chunk`, given the copy here is write `version`.
OwnerHolds owner_holds(uint32_t chunk, uint32_t level, uint64_t version, const std::vector<storage::ChunkStat>& stats);

/// What becomes of a surplus copy, given what each of its owners holds of its write.
struct SurplusPlan {
  enum class Action {
    drop,       ///< every owner holds the write or a newer one
    hand_over,  ///< send it to the owners in `to` first, then drop it
    keep,       ///< an owner does not say its versions: the copy may be the newest
  };
  Action action = Action::drop;
  std::vector<size_t> to;  ///< hand_over: the owners (indices into the holds) that need it
};
SurplusPlan plan_surplus(std::span<const OwnerHolds> holds);

}  // namespace kvstream::cluster

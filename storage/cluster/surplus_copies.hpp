// Surplus copies: the copies a node holds of chunks it no longer owns, left behind
// when a membership change gave the chunks new owners. Once every member has finished
// copying for the new set, a node drops such a copy if each owner holds the same write
// or a newer one (ChunkStat::level_versions), so dropping it loses no write; it keeps
// the copy otherwise (docs/storage-backends.md, "Surplus copies").
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvstream/storage.hpp"

namespace kvstream::cluster {

enum class SurplusVerdict {
  drop,         ///< every owner holds this write or a newer one
  owner_lacks,  ///< an owner holds no copy of that level (never copied, evicted, removed)
  owner_older,  ///< an owner holds an older write: this one reached only non-owners
  unknown,      ///< an owner does not say its versions (a node from before them)
};

/// Whether level `level` of chunk `chunk`, held here at write `version`, may go, given
/// each owner's stat of its context (an empty one: the owner holds none of it).
SurplusVerdict judge_surplus(uint32_t chunk, uint32_t level, uint64_t version,
                             std::span<const std::vector<storage::ChunkStat>* const> owners);

}  // namespace kvstream::cluster

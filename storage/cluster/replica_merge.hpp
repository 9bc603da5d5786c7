// How a replicated client merges what several nodes answered of the same data: each
// holds some of a context's chunks (its replicas, copies not dropped yet), possibly
// different writes of one of them while a write or a rebalance is under way.
#pragma once

#include <string>
#include <vector>

#include "kvstream/storage.hpp"

namespace kvstream::cluster {

/// Every chunk any node named, by chunk id. Per level the larger size wins, and its
/// parts table with it (a level's size and parts are always one replica's, one
/// write's; replicas that differ are logged, naming `context`); per level the newest
/// write version any node said (none where no node said). Empty when no node named one.
std::vector<storage::ChunkStat> merge_stats(const std::string& context,
                                            std::vector<std::vector<storage::ChunkStat>> answers);

/// Every context any node named, by name: the larger size and the newest write and use
/// marks of any node (the depth goes with the use mark), the union of their chunks.
std::vector<storage::ContextUsage> merge_usage(std::vector<std::vector<storage::ContextUsage>> answers);

}  // namespace kvstream::cluster

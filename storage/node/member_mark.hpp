// When a node's store was last served by a member of a cluster: `<dir>/.member`, the
// time of the node's last renewal of its etcd lease, rewritten at most once a minute.
//
// A node that comes back into a cluster is handed the removes its members made while it
// was away (tombstones.hpp), but they remember each remove only for `remove_memory`
// (24 h by default). A node away longer may hold copies of contexts removed early in
// its absence that no member remembers any more: they would be served again once its
// fence lifts, and handed to their owners by its trim. So a node whose mark is older
// than that drops what it held at start instead (as a database replica down longer
// than its tombstones live must be rebuilt, not rejoined); a store without a mark (new,
// or only ever run alone) keeps its objects.
//
// One mark record (mark_record.hpp): its u64 the seconds since the epoch.
// Written to a temporary name, synced and renamed over the mark, so a crash leaves the
// old mark or the new one; a file that does not verify reads as none (and is logged).
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "kvstream/status.hpp"

namespace kvstream::storage {

/// The mark's name in the store's directory (not an object or namespace name: those
/// do not start with a dot).
inline constexpr const char* kMemberMarkFile = ".member";

/// The time in `dir`'s mark, to the second; nullopt where there is none, or it does
/// not verify.
std::optional<std::chrono::system_clock::time_point> read_member_mark(const std::string& dir);

/// Writes `at` as `dir`'s mark (durably). Errors: io_error.
Status write_member_mark(const std::string& dir, std::chrono::system_clock::time_point at);

}  // namespace kvstream::storage

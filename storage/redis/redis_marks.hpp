// Use marks on Redis (storage::Client::touch and usage): a hash per namespace maps a
// context to "<stamp> <depth>", raised by a script so that a mark never goes down and
// only a listed context gets one; the usage listing sums the contexts' size tables.
// Shared by the client of one server and the cluster client (whose marks hash sits in
// the namespace's contexts slot, so the script reads both on one node).
#pragma once

#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <hiredis/hiredis.h>

#include "kvstream/storage.hpp"

namespace kvstream::redis::detail {

/// The argv of the EVAL that raises each of `contexts`' marks in hash `marks_key` to
/// `stamp` (0: next_write_version(); an equal stamp takes the depth given now), for
/// those listed in set `contexts_key`; empty when there are no contexts. Errors:
/// invalid_argument (a context id; a stamp at or above 2^53, which a Lua number would
/// round).
Result<std::vector<std::string>> touch_command(const std::string& marks_key, const std::string& contexts_key,
                                               std::span<const storage::ContextTouch> contexts, uint64_t stamp);

/// The contexts of a SMEMBERS reply that start with `prefix`, by name, with the marks
/// an HGETALL reply of the marks hash gives them (none: 0; malformed values are
/// skipped). Errors: unavailable (error replies), corrupt_data.
Result<std::map<std::string, storage::ContextUsage>> listed_with_marks(const redisReply* members,
                                                                       const redisReply* marks,
                                                                       const std::string& prefix);

/// The values of `listed`, in its (name) order.
std::vector<storage::ContextUsage> in_name_order(std::map<std::string, storage::ContextUsage>&& listed);

/// Adds one size table (an HGETALL reply of "<chunk>:<level>" -> bytes, named `name`
/// for errors) to `u`'s bytes and to `chunks`. Errors: corrupt_data.
Status add_sizes(const redisReply* sizes, const std::string& name, storage::ContextUsage& u,
                 std::set<uint32_t>& chunks);

}  // namespace kvstream::redis::detail

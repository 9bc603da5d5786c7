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

/// EVAL with KEYS[1] the marks hash, KEYS[2] the contexts set, then touch_args: raises
/// each listed context's mark to the stamp (an equal stamp takes the depth given now).
extern const char* const kTouchScript;

/// The script's arguments: the stamp (0: next_write_version()), then each context and
/// its depth. Errors: invalid_argument (a context id; a stamp at or above 2^53, which a
/// Lua number would round).
Result<std::vector<std::string>> touch_args(std::span<const storage::ContextTouch> contexts, uint64_t stamp);

/// Sets `used` and `depth` of the entries of `out` that the marks hash (an HGETALL
/// reply) names; entries it does not name keep 0, malformed values are skipped.
void apply_marks(const redisReply* marks, std::map<std::string, storage::ContextUsage>& out);

/// Adds one size table (an HGETALL reply of "<chunk>:<level>" -> bytes, named `name`
/// for errors) to `u`'s bytes and to `chunks`. Errors: corrupt_data.
Status add_sizes(const redisReply* sizes, const std::string& name, storage::ContextUsage& u,
                 std::set<uint32_t>& chunks);

}  // namespace kvstream::redis::detail

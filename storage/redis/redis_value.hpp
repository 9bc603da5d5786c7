// How a chunk is kept in Redis, whichever client wrote it (redis_storage.hpp has the
// key layouts): the value is an 8-byte xxh3-64 of the payload seeded with the key,
// then the payload; beside it, one u64 sum per 64 KiB block for range reads; the
// size and parts tables say what stat returns. With encryption at rest the value is
// sealed instead (redis_seal.hpp) and has no block sums. Internal to the Redis
// clients.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kvstream/storage.hpp"
#include "storage/redis/redis_conn.hpp"
#include "storage/redis/redis_seal.hpp"

namespace kvstream::redis::detail {

constexpr size_t kChecksumBytes = 8;
constexpr uint64_t kBlockBytes = uint64_t(64) << 10;

/// A chunk's value and its block sums, ready to SET (shared: a call may end while
/// they are still on the wire). `sums` is null for a sealed value: its block sums
/// key is deleted instead.
struct EncodedValue {
  std::shared_ptr<const std::string> value, sums;
};
/// In clear when `sealer` is null, else sealed under the current key. Errors:
/// internal (sealing failed).
Result<EncodedValue> encode_value(const std::string& key, std::span<const std::byte> payload, const Sealer* sealer);
/// The command that writes (or, for a sealed value, removes) the block sums.
Command sums_command(const EncodedValue& v, const std::string& blocks_key);

/// The verified payload of a GET reply for `key`, inside the reply (a sealed value
/// is opened in place). Errors: not_found (nil), corrupt_data (not a chunk, checksum,
/// authentication, a clear value where the sealer refuses them), permission_denied
/// (sealed, and no sealer or not its key id), those of the reply.
Result<std::span<const std::byte>> verified_payload(const std::string& key, redisReply* r, const Sealer* sealer);

/// Runs commands where the key's slot lives (a Conn, or the cluster's routing).
using Runner = std::function<Result<std::vector<Reply>>(const std::vector<Command>&)>;

/// Verified bytes of a payload, inside the reply that holds them.
struct RangeRead {
  Reply owner;
  std::span<const std::byte> bytes;
};
/// Bytes [offset, offset + length) of the payload under `key`: one MULTI/EXEC reads
/// its length, the blocks that hold the range and their sums; each block is verified.
/// A value without block sums is read whole and verified instead. With a sealer,
/// the MULTI/EXEC reads the header and the sealed blocks of the range, and opens
/// them; a clear value found then is read again as above (when the sealer reads
/// clear values). Errors: not_found, out_of_range, corrupt_data, permission_denied,
/// those of `run`.
Result<RangeRead> read_range(const Runner& run, const std::string& key, const std::string& blocks_key,
                             uint64_t offset, uint64_t length, const Sealer* sealer);

/// "chunk:level", as the size and parts tables name an object.
std::string object_field(uint32_t chunk, uint32_t level);
/// Adds the entries of one size table and its parts table (HGETALL replies, named
/// for errors) to `stats`. Errors: corrupt_data.
Status merge_stat_tables(const redisReply* sizes, const std::string& sizes_name, const redisReply* parts,
                         const std::string& parts_name, std::map<uint32_t, storage::ChunkStat>& stats);
/// The merged stats in chunk order, their parts trimmed (storage.hpp's rule).
std::vector<storage::ChunkStat> finish_stats(std::map<uint32_t, storage::ChunkStat>&& stats);

}  // namespace kvstream::redis::detail

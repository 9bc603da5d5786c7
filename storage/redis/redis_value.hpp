// How a chunk is kept in Redis, whichever client wrote it (redis_storage.hpp has the
// key layouts): the value is an 8-byte xxh3-64 of the payload seeded with the key,
// then the payload; beside it, one u64 sum per 64 KiB block for range reads; the
// size and parts tables say what stat returns. Internal to the Redis clients.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kvstream/storage.hpp"
#include "storage/redis/redis_conn.hpp"

namespace kvstream::redis::detail {

constexpr size_t kChecksumBytes = 8;
constexpr uint64_t kBlockBytes = uint64_t(64) << 10;

/// A chunk's value and its block sums, ready to SET (shared: a call may end while
/// they are still on the wire).
struct EncodedValue {
  std::shared_ptr<const std::string> value, sums;
};
EncodedValue encode_value(const std::string& key, std::span<const std::byte> payload);

/// The verified payload of a GET reply for `key`, inside the reply. Errors:
/// not_found (nil), corrupt_data (not a chunk, checksum), those of the reply.
Result<std::span<const std::byte>> verified_payload(const std::string& key, const redisReply* r);

/// Runs commands where the key's slot lives (a Conn, or the cluster's routing).
using Runner = std::function<Result<std::vector<Reply>>(const std::vector<Command>&)>;

/// Verified bytes of a payload, inside the reply that holds them.
struct RangeRead {
  Reply owner;
  std::span<const std::byte> bytes;
};
/// Bytes [offset, offset + length) of the payload under `key`: one MULTI/EXEC reads
/// its length, the blocks that hold the range and their sums; each block is verified.
/// A value without block sums is read whole and verified instead. Errors: not_found,
/// out_of_range, corrupt_data, those of `run`.
Result<RangeRead> read_range(const Runner& run, const std::string& key, const std::string& blocks_key,
                             uint64_t offset, uint64_t length);

/// "chunk:level", as the size and parts tables name an object.
std::string object_field(uint32_t chunk, uint32_t level);
/// Adds the entries of one size table and its parts table (HGETALL replies, named
/// for errors) to `stats`. Errors: corrupt_data.
Status merge_stat_tables(const redisReply* sizes, const std::string& sizes_name, const redisReply* parts,
                         const std::string& parts_name, std::map<uint32_t, storage::ChunkStat>& stats);
/// The merged stats in chunk order, their parts trimmed (storage.hpp's rule).
std::vector<storage::ChunkStat> finish_stats(std::map<uint32_t, storage::ChunkStat>&& stats);

}  // namespace kvstream::redis::detail

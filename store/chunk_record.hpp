// The record stored beside a chunk's levels: how many tokens it holds, where it
// starts, and when it was stored. It is written after every level, so its presence
// means the chunk is complete (a put cut short leaves no record and is not found).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvstream/status.hpp"

namespace kvstream::store {

/// The chunk id, within a chunk's storage context, of its levels and of its record.
inline constexpr uint32_t kLevelsChunk = 0;
inline constexpr uint32_t kRecordChunk = 1;

struct ChunkRecord {
  uint32_t tokens = 0;
  uint64_t first_position = 0;
  uint64_t stored_unix_ms = 0;
  uint32_t levels = 0;           ///< levels the put stored
  bool operator==(const ChunkRecord&) const = default;
};

/// 40 bytes: magic, version, fields, xxh3-64 checksum.
std::vector<std::byte> serialize(const ChunkRecord& r);
/// Errors: corrupt_data (size, magic, version, checksum).
Result<ChunkRecord> parse_chunk_record(std::span<const std::byte> bytes);
/// Bytes of a serialized record.
inline constexpr size_t kChunkRecordBytes = 40;

}  // namespace kvstream::store

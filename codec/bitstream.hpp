// The chunk bitstream's header: layout, writing and checked parsing.
// The format is documented in docs/bitstream.md; keep the two in step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "codec/byte_io.hpp"
#include "kvstream/codec.hpp"

namespace kvstream::codec {

inline constexpr char kChunkMagic[4] = {'K', 'V', 'S', 'C'};
inline constexpr uint16_t kChunkVersion = 1;
inline constexpr size_t kChunkHeaderBytes = 64;  // fixed part, before the substream length table
inline constexpr uint32_t kMaxChunkTokens = 1u << 20;
inline constexpr uint64_t kMaxChunkBytes = uint64_t(1) << 36;

/// Header fields, as written. `substream_bytes` has layers * planes entries.
struct ChunkHeader {
  ChunkInfo info;
  uint16_t group_size = 0;
  uint8_t flags = 0;  // bit 0: K coded before RoPE
  std::vector<uint32_t> substream_bytes;
};

/// The fields at bytes 6..47 that both versions share. `byte7` is version 1's level
/// and version 2's layer count.
struct SharedHeader {
  ChunkInfo info;  // geometry, dtype, tokens, first position, profile hash
  uint8_t byte7 = 0, flags = 0;
  uint16_t group_size = 0;
};
/// Checks the size and magic every chunk starts with and reads its version; `r` is
/// left at byte 6. Errors: corrupt_data.
Result<uint16_t> read_chunk_version(std::span<const uint8_t> bytes, ByteReader& r);
/// Reads them from `r` (positioned at byte 6) and checks their bounds. Errors:
/// corrupt_data.
Result<SharedHeader> read_shared_header(ByteReader& r);
/// Writes the 48 bytes of magic, `version` and the shared fields.
void write_shared_header(ByteWriter& w, uint16_t version, const SharedHeader& h);

/// Reserves the header and length table at the front of `out` (from `at`); the
/// caller fills the substreams after it, then calls finish_header.
void begin_header(std::vector<uint8_t>& out, size_t at, uint32_t substreams);
/// Writes the header fields, lengths and both checksums into the reserved space.
void finish_header(std::vector<uint8_t>& out, size_t at, const ChunkHeader& h);

/// Parses and checks the header and lengths (not the payload checksum). On success
/// `payload_offset` is where the first substream begins.
Result<ChunkHeader> parse_header(std::span<const uint8_t> bytes, size_t* payload_offset);
/// parse_header, then checks the header against the profile the caller decodes
/// with (hash, geometry, group size, flags, level). Every decoder starts here.
Result<ChunkHeader> parse_header_for(const Profile& profile, std::span<const uint8_t> bytes, size_t* payload_offset);

/// Verifies the payload checksum of a stream whose header parsed.
Status verify_payload(std::span<const uint8_t> bytes, size_t payload_offset);

}  // namespace kvstream::codec

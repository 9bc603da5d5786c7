#include "store/chunk_record.hpp"

#include <cstring>

#include <xxhash.h>

namespace kvstream::store {
namespace {
constexpr uint32_t kMagic = 0x4b565352;  // "KVSR"
constexpr uint32_t kVersion = 1;

template <typename T>
void put_le(std::byte* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = std::byte((uint64_t(v) >> (8 * i)) & 0xff);
}
template <typename T>
T get_le(const std::byte* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return T(v);
}
}  // namespace

std::vector<std::byte> serialize(const ChunkRecord& r) {
  std::vector<std::byte> b(kChunkRecordBytes);
  put_le<uint32_t>(&b[0], kMagic);
  put_le<uint32_t>(&b[4], kVersion);
  put_le<uint32_t>(&b[8], r.tokens);
  put_le<uint32_t>(&b[12], r.levels);
  put_le<uint64_t>(&b[16], r.first_position);
  put_le<uint64_t>(&b[24], r.stored_unix_ms);
  put_le<uint64_t>(&b[32], XXH3_64bits(b.data(), 32));
  return b;
}

Result<ChunkRecord> parse_chunk_record(std::span<const std::byte> b) {
  if (b.size() != kChunkRecordBytes)
    return make_status(StatusCode::corrupt_data, "chunk record of {} bytes (want {})", b.size(), kChunkRecordBytes);
  if (get_le<uint32_t>(&b[0]) != kMagic) return make_status(StatusCode::corrupt_data, "not a chunk record");
  if (get_le<uint32_t>(&b[4]) != kVersion)
    return make_status(StatusCode::corrupt_data, "chunk record version {} (this build reads {})",
                       get_le<uint32_t>(&b[4]), kVersion);
  if (get_le<uint64_t>(&b[32]) != XXH3_64bits(b.data(), 32))
    return make_status(StatusCode::corrupt_data, "chunk record checksum mismatch");
  ChunkRecord r;
  r.tokens = get_le<uint32_t>(&b[8]);
  r.levels = get_le<uint32_t>(&b[12]);
  r.first_position = get_le<uint64_t>(&b[16]);
  r.stored_unix_ms = get_le<uint64_t>(&b[24]);
  return r;
}

}  // namespace kvstream::store

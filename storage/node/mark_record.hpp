// The 24-byte record of the store's small marks (a context's use mark, the store's
// member mark): a magic number naming the mark, a u32 and a u64 of its own, and an
// xxh3-64 of the 16 bytes before it, so a torn or foreign file reads as no mark.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace kvstream::storage {

inline constexpr size_t kMarkRecordBytes = 24;

struct MarkRecord {
  uint32_t small = 0;
  uint64_t large = 0;
};

std::array<std::byte, kMarkRecordBytes> encode_mark_record(uint32_t magic, MarkRecord r);

/// The record in the file at `path` under `magic`; nullopt where there is no such
/// file, or it is not exactly one record that verifies.
std::optional<MarkRecord> read_mark_record(const std::string& path, uint32_t magic);

}  // namespace kvstream::storage

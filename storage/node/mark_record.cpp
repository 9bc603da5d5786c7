// The store's mark records: see mark_record.hpp.
#include "storage/node/mark_record.hpp"

#include <cstring>

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

namespace kvstream::storage {

std::array<std::byte, kMarkRecordBytes> encode_mark_record(uint32_t magic, MarkRecord r) {
  std::array<std::byte, kMarkRecordBytes> b{};
  std::memcpy(b.data(), &magic, 4);
  std::memcpy(b.data() + 4, &r.small, 4);
  std::memcpy(b.data() + 8, &r.large, 8);
  const uint64_t sum = XXH3_64bits(b.data(), 16);
  std::memcpy(b.data() + 16, &sum, 8);
  return b;
}

std::optional<MarkRecord> read_mark_record(const std::string& path, uint32_t magic) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::array<std::byte, kMarkRecordBytes + 1> b{};  // one more: a longer file is not a mark
  const ssize_t n = ::pread(fd, b.data(), b.size(), 0);
  ::close(fd);
  if (n != ssize_t(kMarkRecordBytes)) return std::nullopt;
  uint32_t got = 0;
  uint64_t sum = 0;
  MarkRecord r;
  std::memcpy(&got, b.data(), 4);
  std::memcpy(&r.small, b.data() + 4, 4);
  std::memcpy(&r.large, b.data() + 8, 8);
  std::memcpy(&sum, b.data() + 16, 8);
  if (got != magic || sum != XXH3_64bits(b.data(), 16)) return std::nullopt;
  return r;
}

}  // namespace kvstream::storage

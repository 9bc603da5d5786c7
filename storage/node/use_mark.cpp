#include "storage/node/use_mark.hpp"

#include <array>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/log.hpp"

namespace kvstream::storage {

namespace {
constexpr uint32_t kMagic = 0x5553564b;  // "KVSU"
// magic u32, depth u32, stamp u64, xxh3-64 of the 16 bytes before it.
constexpr size_t kBytes = 24;

std::array<std::byte, kBytes> encode(UseMark m) {
  std::array<std::byte, kBytes> b{};
  std::memcpy(b.data(), &kMagic, 4);
  std::memcpy(b.data() + 4, &m.depth, 4);
  std::memcpy(b.data() + 8, &m.stamp, 8);
  const uint64_t sum = XXH3_64bits(b.data(), 16);
  std::memcpy(b.data() + 16, &sum, 8);
  return b;
}
}  // namespace

std::optional<UseMark> read_use_mark(const std::string& context_dir) {
  const std::string path = context_dir + "/" + kUseMarkFile;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::array<std::byte, kBytes + 1> b{};  // one more: a longer file is not a mark
  const ssize_t n = ::pread(fd, b.data(), b.size(), 0);
  ::close(fd);
  if (n != ssize_t(kBytes)) return std::nullopt;
  uint32_t magic = 0;
  uint64_t sum = 0;
  UseMark m;
  std::memcpy(&magic, b.data(), 4);
  std::memcpy(&m.depth, b.data() + 4, 4);
  std::memcpy(&m.stamp, b.data() + 8, 8);
  std::memcpy(&sum, b.data() + 16, 8);
  if (magic != kMagic || sum != XXH3_64bits(b.data(), 16)) return std::nullopt;
  return m;
}

Status write_use_mark(const std::string& context_dir, UseMark mark) {
  const std::string path = context_dir + "/" + kUseMarkFile;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    KVS_LOG_WARN("cannot write the use mark '{}': {}", path, std::strerror(e));
    return make_status(StatusCode::io_error, "cannot keep a context's use mark: {}", std::strerror(e));
  }
  const auto b = encode(mark);
  const ssize_t n = ::pwrite(fd, b.data(), b.size(), 0);
  const int e = errno;
  ::close(fd);
  if (n == ssize_t(b.size())) return {};
  KVS_LOG_WARN("cannot write the use mark '{}': {}", path, n < 0 ? std::strerror(e) : "short write");
  return make_status(StatusCode::io_error, "cannot keep a context's use mark");
}

}  // namespace kvstream::storage

// The store's member mark: see member_mark.hpp.
#include "storage/node/member_mark.hpp"

#include <array>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/log.hpp"

namespace kvstream::storage {
namespace {

constexpr uint32_t kMagic = 0x4d53564b;  // "KVSM"
constexpr size_t kBytes = 24;

std::array<std::byte, kBytes> encode(int64_t seconds) {
  std::array<std::byte, kBytes> b{};
  std::memcpy(b.data(), &kMagic, 4);
  std::memcpy(b.data() + 8, &seconds, 8);
  const uint64_t sum = XXH3_64bits(b.data(), 16);
  std::memcpy(b.data() + 16, &sum, 8);
  return b;
}

Status write_error(const std::string& path, std::string_view what, int err) {
  KVS_LOG_WARN("cannot write the member mark '{}': {} ({})", path, what, std::strerror(err));
  return make_status(StatusCode::io_error, "cannot write the member mark '{}': {}: {}", path, what,
                     std::strerror(err));
}

}  // namespace

std::optional<std::chrono::system_clock::time_point> read_member_mark(const std::string& dir) {
  const std::string path = dir + "/" + kMemberMarkFile;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::array<std::byte, kBytes + 1> b{};  // one more: a longer file is not a mark
  const ssize_t n = ::pread(fd, b.data(), b.size(), 0);
  ::close(fd);
  uint32_t magic = 0;
  int64_t seconds = 0;
  uint64_t sum = 0;
  if (n == ssize_t(kBytes)) {
    std::memcpy(&magic, b.data(), 4);
    std::memcpy(&seconds, b.data() + 8, 8);
    std::memcpy(&sum, b.data() + 16, 8);
  }
  if (n != ssize_t(kBytes) || magic != kMagic || sum != XXH3_64bits(b.data(), 16)) {
    KVS_LOG_WARN("store '{}': the member mark does not verify; taken as none", dir);
    return std::nullopt;
  }
  return std::chrono::system_clock::time_point(std::chrono::seconds(seconds));
}

Status write_member_mark(const std::string& dir, std::chrono::system_clock::time_point at) {
  const std::string path = dir + "/" + kMemberMarkFile;
  const std::string tmp = path + ".new";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return write_error(path, "open", errno);
  const auto b = encode(std::chrono::duration_cast<std::chrono::seconds>(at.time_since_epoch()).count());
  const ssize_t n = ::pwrite(fd, b.data(), b.size(), 0);
  const int werr = n < 0 ? errno : EIO;
  if (n != ssize_t(b.size()) || ::fdatasync(fd) != 0) {
    const int err = n == ssize_t(b.size()) ? errno : werr;
    ::close(fd);
    ::unlink(tmp.c_str());
    return write_error(path, "write", err);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return write_error(path, "rename", err);
  }
  return {};
}

}  // namespace kvstream::storage

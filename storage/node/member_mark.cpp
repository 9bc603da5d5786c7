// The store's member mark: see member_mark.hpp.
#include "storage/node/member_mark.hpp"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include "core/log.hpp"
#include "storage/node/mark_record.hpp"

namespace kvstream::storage {
namespace {

constexpr uint32_t kMagic = 0x4d53564b;  // "KVSM"; the record's u64 is the time in seconds

Status write_error(const std::string& path, std::string_view what, int err) {
  KVS_LOG_WARN("cannot write the member mark '{}': {} ({})", path, what, std::strerror(err));
  return make_status(StatusCode::io_error, "cannot write the member mark '{}': {}: {}", path, what,
                     std::strerror(err));
}

}  // namespace

std::optional<std::chrono::system_clock::time_point> read_member_mark(const std::string& dir) {
  const std::string path = dir + "/" + kMemberMarkFile;
  const auto r = read_mark_record(path, kMagic);
  if (!r) {
    if (::access(path.c_str(), F_OK) == 0) KVS_LOG_WARN("store '{}': the member mark does not verify; taken as none", dir);
    return std::nullopt;
  }
  return std::chrono::system_clock::time_point(std::chrono::seconds(int64_t(r->large)));
}

Status write_member_mark(const std::string& dir, std::chrono::system_clock::time_point at) {
  const std::string path = dir + "/" + kMemberMarkFile;
  const std::string tmp = path + ".new";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return write_error(path, "open", errno);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(at.time_since_epoch()).count();
  const auto b = encode_mark_record(kMagic, {0, uint64_t(seconds)});
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

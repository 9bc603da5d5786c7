#include "storage/node/use_mark.hpp"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include "core/log.hpp"
#include "storage/node/mark_record.hpp"

namespace kvstream::storage {

namespace {
constexpr uint32_t kUseMarkMagic = 0x5553564b;  // "KVSU"; the record's u32 is the depth, its u64 the stamp
}  // namespace

std::optional<UseMark> read_use_mark(const std::string& context_dir) {
  const auto r = read_mark_record(context_dir + "/" + kUseMarkFile, kUseMarkMagic);
  if (!r) return std::nullopt;
  return UseMark{r->large, r->small};
}

Status write_use_mark(const std::string& context_dir, UseMark mark) {
  const std::string path = context_dir + "/" + kUseMarkFile;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    KVS_LOG_WARN("cannot write the use mark '{}': {}", path, std::strerror(e));
    return make_status(StatusCode::io_error, "cannot keep a context's use mark: {}", std::strerror(e));
  }
  const auto b = encode_mark_record(kUseMarkMagic, {mark.depth, mark.stamp});
  const ssize_t n = ::pwrite(fd, b.data(), b.size(), 0);
  const int e = errno;
  ::close(fd);
  if (n == ssize_t(b.size())) return {};
  KVS_LOG_WARN("cannot write the use mark '{}': {}", path, n < 0 ? std::strerror(e) : "short write");
  return make_status(StatusCode::io_error, "cannot keep a context's use mark");
}

}  // namespace kvstream::storage

#include "storage/node/dir_lock.hpp"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "core/log.hpp"

namespace kvstream::storage {

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
}

Result<DirLock> DirLock::acquire(const std::string& dir) {
  const std::string path = dir + "/.lock";
  DirLock l;
  l.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  if (l.fd_ < 0) return make_status(StatusCode::io_error, "cannot open '{}': {}", path, std::strerror(errno));
  if (::flock(l.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    char pid[32] = {};
    const ssize_t n = ::pread(l.fd_, pid, sizeof pid - 1, 0);
    if (e == EWOULDBLOCK)
      return make_status(StatusCode::already_exists, "storage directory '{}' is in use by another node (pid {})", dir,
                         n > 0 ? std::string(pid, size_t(n)) : std::string("unknown"));
    return make_status(StatusCode::io_error, "cannot lock '{}': {}", path, std::strerror(e));
  }
  const std::string me = std::to_string(::getpid());
  if (::ftruncate(l.fd_, 0) != 0 || ::pwrite(l.fd_, me.data(), me.size(), 0) != ssize_t(me.size()))
    KVS_LOG_WARN("cannot record this process in '{}': {}", path, std::strerror(errno));
  return l;
}

}  // namespace kvstream::storage

// An exclusive lock on a storage directory, held for a node's lifetime, so that two
// nodes never serve (and overwrite) one store. The kernel drops it when the process
// dies, kill -9 included, so a restart never waits on a stale lock.
#pragma once

#include <string>

#include "kvstream/status.hpp"

namespace kvstream::storage {

class DirLock {
 public:
  DirLock() = default;
  DirLock(DirLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  DirLock& operator=(DirLock&& o) noexcept;
  ~DirLock();
  /// Takes `<dir>/.lock` (flock, non-blocking) and writes this process's id into it.
  /// Errors: already_exists (another live process holds it; the message gives its
  /// pid), io_error.
  static Result<DirLock> acquire(const std::string& dir);

 private:
  int fd_ = -1;
};

}  // namespace kvstream::storage

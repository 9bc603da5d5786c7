// The file of remembered removes (tombstone_log.hpp).
#include "storage/node/tombstone_log.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <utility>

#include <fcntl.h>
#include <unistd.h>
#include <fmt/format.h>
#include <xxhash.h>

#include "core/log.hpp"
#include "storage/node/object_file.hpp"
#include "storage/protocol.hpp"

namespace kvstream::storage {

namespace {

Status io_failure(const std::string& what, const std::string& path, int err) {
  KVS_LOG_WARN("{} '{}': {}", what, path, std::strerror(err));
  return make_status(StatusCode::io_error, "{} the node's remembered removes: {}", what, std::strerror(err));
}

// The file's bytes; none when it does not exist. Returns io_error otherwise.
Status read_whole(const std::string& path, std::string& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? Status() : io_failure("cannot open", path, errno);
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return io_failure("cannot read", path, e);
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return {};
}

std::string parent_of(const std::string& path) {
  const auto p = std::filesystem::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

}  // namespace

std::string TombstoneLog::format(const TombstoneRecord& r) {
  const std::string body = fmt::format("{} {} {} {}", r.ns, r.ctx, r.version, r.unix_ms);
  return fmt::format("{} {:016x}\n", body, XXH3_64bits(body.data(), body.size()));
}

bool TombstoneLog::parse(const std::string& line, TombstoneRecord& out) {
  const size_t last = line.rfind(' ');
  if (last == std::string::npos || line.size() - last - 1 != 16) return false;
  const std::string body = line.substr(0, last);
  uint64_t sum = 0;
  std::istringstream hex(line.substr(last + 1));
  if (!(hex >> std::hex >> sum) || sum != XXH3_64bits(body.data(), body.size())) return false;
  std::istringstream in(body);
  TombstoneRecord r;
  std::string rest;
  if (!(in >> r.ns >> r.ctx >> r.version >> r.unix_ms) || (in >> rest)) return false;
  if (!validate_id(r.ns, kMaxNamespaceBytes, "namespace").ok()) return false;
  if (r.horizon() ? r.version != 0 : !validate_id(r.ctx, kMaxContextBytes, "context").ok()) return false;
  out = std::move(r);
  return true;
}

Result<TombstoneLog> TombstoneLog::open(const std::string& path, std::vector<TombstoneRecord>& records) {
  size_t lines = 0, skipped = 0;
  bool torn = false;
  {
    std::string all;
    KVS_RETURN_IF_ERROR(read_whole(path, all));
    torn = !all.empty() && all.back() != '\n';
    std::istringstream text(all);
    for (std::string line; std::getline(text, line);) {
      ++lines;
      TombstoneRecord r;
      if (parse(line, r)) records.push_back(std::move(r));
      else ++skipped;
    }
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return io_failure("cannot open", path, errno);
  TombstoneLog log(path, fd, lines);
  // A line cut short (a crash mid-append) would run into the next append, and take
  // that record with it: the file is written again without it first.
  if (skipped > 0 || torn) {
    KVS_LOG_WARN("'{}': {} of {} lines do not verify (a write cut short); rewritten without them", path, skipped,
                 lines);
    KVS_RETURN_IF_ERROR(log.rewrite(records));
  }
  return log;
}

TombstoneLog::TombstoneLog(TombstoneLog&& o) noexcept
    : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)), lines_(o.lines_) {}

TombstoneLog& TombstoneLog::operator=(TombstoneLog&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_), fd_ = std::exchange(o.fd_, -1), lines_ = o.lines_;
  }
  return *this;
}

TombstoneLog::~TombstoneLog() {
  if (fd_ >= 0) ::close(fd_);
}

Status TombstoneLog::append(std::span<const TombstoneRecord> records) {
  std::string lines;
  for (const auto& r : records) lines += format(r);
  if (const int e = write_all(fd_, lines)) return io_failure("cannot append to", path_, e);
  lines_ += records.size();
  if (::fdatasync(fd_) != 0) return io_failure("cannot sync", path_, errno);
  return {};
}

Status TombstoneLog::rewrite(const std::vector<TombstoneRecord>& records) {
  std::string all;
  for (const auto& r : records) all += format(r);
  if (const int e = replace_file(path_, all)) return io_failure("cannot rewrite", path_, e);
  // The new file is in place: appends go to it from here on, whatever the sync says.
  const int nfd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (nfd < 0) return io_failure("cannot open", path_, errno);
  ::close(fd_);
  fd_ = nfd, lines_ = records.size();
  return fsync_directory(parent_of(path_));
}

}  // namespace kvstream::storage

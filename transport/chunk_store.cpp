#include "transport/chunk_store.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#if KVSTREAM_HAVE_URING
#include <liburing.h>

#include "transport/ring_lifetime.hpp"
#endif

#include "core/log.hpp"

namespace kvstream::storage {

namespace fs = std::filesystem;

namespace {
// Object file: u64 xxh3-64 of the payload, then the payload.
constexpr size_t kObjectHeader = 8;

Status sys_error(std::string_view what, const std::string& path) {
  const int e = errno;
  return make_status(e == ENOSPC ? StatusCode::resource_exhausted : StatusCode::io_error, "{} '{}': {}", what, path,
                     std::strerror(e));
}

Status write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return sys_error("write", path);
    p += w, n -= size_t(w);
  }
  return {};
}

Status fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return sys_error("open directory", dir);
  const int r = ::fsync(fd);
  ::close(fd);
  return r == 0 ? Status{} : sys_error("fsync directory", dir);
}
}  // namespace

Result<std::vector<std::byte>> read_file(const std::string& path, size_t offset) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return make_status(StatusCode::not_found, "no object '{}'", path);
    return sys_error("open", path);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return sys_error("stat", path);
  }
  if (size_t(st.st_size) < offset) {
    ::close(fd);
    return make_status(StatusCode::io_error, "'{}' is {} bytes, shorter than {}", path, st.st_size, offset);
  }
  std::vector<std::byte> out(size_t(st.st_size) - offset);
  size_t done = 0;
#if KVSTREAM_HAVE_URING
  // One small ring per reading thread; the whole file is read in up to 8 parallel
  // segments per submission.
  thread_local struct Ring {
    io_uring ring{};
    bool ok = init();
    bool init() {
      if (io_uring_queue_init(8, &ring, 0) != 0) return false;
      transport::note_ring_mapped();
      return true;
    }
    ~Ring() {
      if (!ok) return;
      transport::note_ring_unmapped();
      io_uring_queue_exit(&ring);
    }
  } r;
  if (r.ok) {
    while (done < out.size()) {
      const size_t seg = size_t(1) << 20;
      unsigned queued = 0;
      for (size_t off = done; off < out.size() && queued < 8; off += seg, ++queued) {
        io_uring_sqe* sqe = io_uring_get_sqe(&r.ring);
        io_uring_prep_read(sqe, fd, out.data() + off, unsigned(std::min(seg, out.size() - off)), off + offset);
        sqe->user_data = off;
      }
      io_uring_submit(&r.ring);
      size_t got = 0;
      bool short_read = false;
      for (unsigned i = 0; i < queued; ++i) {
        io_uring_cqe* cqe = nullptr;
        if (io_uring_wait_cqe(&r.ring, &cqe) != 0) {
          ::close(fd);
          return make_status(StatusCode::io_error, "io_uring wait on '{}'", path);
        }
        if (cqe->res < 0) {
          errno = -cqe->res;
          io_uring_cqe_seen(&r.ring, cqe);
          ::close(fd);
          return sys_error("read", path);
        }
        const size_t want = std::min(seg, out.size() - size_t(cqe->user_data));
        short_read |= size_t(cqe->res) != want;
        got += size_t(cqe->res);
        io_uring_cqe_seen(&r.ring, cqe);
      }
      if (short_read) break;  // file shrank under us: the checksum will say so
      done += got;
    }
    ::close(fd);
    if (done != out.size()) return make_status(StatusCode::io_error, "short read of '{}'", path);
    return out;
  }
#endif
  while (done < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, off_t(done + offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return n == 0 ? make_status(StatusCode::io_error, "short read of '{}'", path) : sys_error("read", path);
    }
    done += size_t(n);
  }
  ::close(fd);
  return out;
}

Result<std::unique_ptr<ChunkStore>> ChunkStore::open(const std::string& directory, uint64_t cache_bytes) {
  if (directory.empty()) return make_status(StatusCode::invalid_argument, "storage directory is not set");
  std::error_code ec;
  fs::create_directories(directory, ec);
  if (ec) return make_status(StatusCode::io_error, "cannot create '{}': {}", directory, ec.message());
  auto s = std::unique_ptr<ChunkStore>(new ChunkStore());
  s->dir_ = directory;
  s->cache_limit_ = cache_bytes;
  // The index is the directory itself: rebuild it, skipping anything that is not a
  // well-formed object name (temporary files of interrupted writes included).
  for (const auto& nsd : fs::directory_iterator(directory, ec)) {
    const std::string ns = nsd.path().filename();
    if (!nsd.is_directory() || !validate_id(ns, kMaxNamespaceBytes, "namespace").ok()) continue;
    for (const auto& cd : fs::directory_iterator(nsd.path(), ec)) {
      const std::string ctx = cd.path().filename();
      if (!cd.is_directory() || !validate_id(ctx, kMaxContextBytes, "context").ok()) continue;
      Context c;
      for (const auto& f : fs::directory_iterator(cd.path(), ec)) {
        unsigned chunk = 0, level = 0;
        char tail = 0;
        const std::string name = f.path().filename();
        if (std::sscanf(name.c_str(), "c%u.l%u%c", &chunk, &level, &tail) != 2 || level >= kMaxLevels) continue;
        if (file_name(chunk, level) != name || f.file_size() < kObjectHeader) continue;
        auto& v = c.sizes[chunk];
        if (v.size() <= level) v.resize(level + 1, 0);
        v[level] = f.file_size() - kObjectHeader;
      }
      if (!c.sizes.empty()) s->index_[ns][ctx] = std::move(c);
    }
  }
  if (ec) return make_status(StatusCode::io_error, "cannot scan '{}': {}", directory, ec.message());
  return s;
}

std::string ChunkStore::path(const std::string& ns, const std::string& ctx) const { return dir_ + "/" + ns + "/" + ctx; }
std::string ChunkStore::file_name(uint32_t chunk, uint32_t level) { return fmt::format("c{}.l{}", chunk, level); }

Status ChunkStore::put(const std::string& ns, const std::string& ctx, uint32_t chunk, uint32_t level,
                       std::span<const std::byte> bytes) {
  KVS_RETURN_IF_ERROR(validate_id(ns, kMaxNamespaceBytes, "namespace"));
  KVS_RETURN_IF_ERROR(validate_id(ctx, kMaxContextBytes, "context id"));
  if (level >= kMaxLevels || bytes.size() > kMaxChunkBytes)
    return make_status(StatusCode::out_of_range, "level {} / {} bytes beyond the store's bounds", level, bytes.size());
  const std::string d = path(ns, ctx);
  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec) return make_status(StatusCode::io_error, "cannot create '{}': {}", d, ec.message());
  const std::string final_path = d + "/" + file_name(chunk, level);
  const std::string tmp = final_path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) return sys_error("create", tmp);
  const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size());
  Status st = write_all(fd, &sum, sizeof sum, tmp);
  if (st.ok()) st = write_all(fd, bytes.data(), bytes.size(), tmp);
  if (st.ok() && ::fsync(fd) != 0) st = sys_error("fsync", tmp);
  if (::close(fd) != 0 && st.ok()) st = sys_error("close", tmp);
  if (st.ok() && std::rename(tmp.c_str(), final_path.c_str()) != 0) st = sys_error("rename", tmp);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return detail::log_error(st);
  }
  KVS_RETURN_IF_ERROR(fsync_dir(d));
  std::lock_guard lock(mu_);
  auto& v = index_[ns][ctx].sizes[chunk];
  if (v.size() <= level) v.resize(level + 1, 0);
  v[level] = bytes.size();
  cache_put(fmt::format("{}/{}/{}", ns, ctx, file_name(chunk, level)),
            std::make_shared<const std::vector<std::byte>>(bytes.begin(), bytes.end()));
  return {};
}

Result<Bytes> ChunkStore::get(const std::string& ns, const std::string& ctx, uint32_t chunk, uint32_t level,
                              bool* cache_hit) {
  const std::string key = fmt::format("{}/{}/{}", ns, ctx, file_name(chunk, level));
  {
    std::lock_guard lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      if (cache_hit) *cache_hit = true;
      return it->second->second;
    }
  }
  if (cache_hit) *cache_hit = false;
  // The checksum first, then the payload straight into the buffer that is served and
  // cached (no second copy of the chunk).
  const std::string file = path(ns, ctx) + "/" + file_name(chunk, level);
  uint64_t sum = 0;
  {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return make_status(StatusCode::not_found, "no object '{}'", file);
      return sys_error("open", file);
    }
    const ssize_t n = ::pread(fd, &sum, sizeof sum, 0);
    ::close(fd);
    if (n != ssize_t(sizeof sum)) return make_status(StatusCode::corrupt_data, "object {} is truncated on disk", key);
  }
  auto raw = read_file(file, kObjectHeader);
  if (!raw.ok()) return raw.status();
  auto bytes = std::make_shared<std::vector<std::byte>>(std::move(raw).value());
  if (XXH3_64bits(bytes->data(), bytes->size()) != sum)
    return detail::log_error(make_status(StatusCode::corrupt_data, "object {} failed its checksum on disk", key));
  std::lock_guard lock(mu_);
  cache_put(key, bytes);
  return Bytes(bytes);
}

Result<std::vector<ChunkStat>> ChunkStore::stat(const std::string& ns, const std::string& ctx) {
  std::lock_guard lock(mu_);
  auto n = index_.find(ns);
  if (n == index_.end()) return make_status(StatusCode::not_found, "no context '{}'", ctx);
  auto c = n->second.find(ctx);
  if (c == n->second.end()) return make_status(StatusCode::not_found, "no context '{}'", ctx);
  std::vector<ChunkStat> out;
  for (const auto& [chunk, sizes] : c->second.sizes) out.push_back({chunk, sizes});
  return out;
}

Status ChunkStore::remove(const std::string& ns, const std::string& ctx) {
  {
    std::lock_guard lock(mu_);
    auto n = index_.find(ns);
    if (n == index_.end() || n->second.erase(ctx) == 0)
      return make_status(StatusCode::not_found, "no context '{}'", ctx);
    cache_drop_prefix(ns + "/" + ctx + "/");
  }
  std::error_code ec;
  fs::remove_all(path(ns, ctx), ec);
  if (ec) return make_status(StatusCode::io_error, "cannot remove context '{}': {}", ctx, ec.message());
  return {};
}

std::vector<std::string> ChunkStore::list(const std::string& ns) {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  if (auto n = index_.find(ns); n != index_.end())
    for (const auto& [ctx, c] : n->second) out.push_back(ctx);
  return out;
}

void ChunkStore::cache_put(const std::string& key, Bytes b) {
  if (b->size() > cache_limit_) return;
  if (auto it = cache_.find(key); it != cache_.end()) {
    cache_used_ -= it->second->second->size();
    lru_.erase(it->second);
    cache_.erase(it);
  }
  lru_.emplace_front(key, std::move(b));
  cache_[key] = lru_.begin();
  cache_used_ += lru_.front().second->size();
  while (cache_used_ > cache_limit_ && !lru_.empty()) {
    cache_used_ -= lru_.back().second->size();
    cache_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

void ChunkStore::cache_drop_prefix(const std::string& prefix) {
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->first.compare(0, prefix.size(), prefix) == 0) {
      cache_used_ -= it->second->size();
      cache_.erase(it->first);
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace kvstream::storage

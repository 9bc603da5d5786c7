#include "storage/node/object_file.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include "core/log.hpp"

namespace kvstream::storage {

namespace {
constexpr uint32_t kObjectMagic = 0x4f53564b;  // "KVSO"
constexpr uint16_t kObjectVersion = 2;         // 1 was u64 checksum + payload, unbound to its name

// Errors name the object, not the file: replies carry these messages to clients.
Status os_error(std::string_view what, std::string_view object, int err) {
  return make_status(err == ENOSPC || err == EDQUOT ? StatusCode::resource_exhausted : StatusCode::io_error,
                     "{} of object {}: {}", what, object, std::strerror(err));
}

uint64_t binding_sum(std::string_view name, std::span<const std::byte> first24) {
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, first24.data(), first24.size());
  XXH3_64bits_update(&st, name.data(), name.size());
  return XXH3_64bits_digest(&st);
}

template <typename T>
void put_le(std::byte* at, T v) {
  std::memcpy(at, &v, sizeof v);
}
template <typename T>
T get_le(const std::byte* at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  return v;
}
}  // namespace

std::array<std::byte, kObjectHeaderBytes> encode_object_header(std::string_view name, const ObjectHeader& h) {
  std::array<std::byte, kObjectHeaderBytes> b{};
  put_le(b.data(), kObjectMagic);
  put_le(b.data() + 4, kObjectVersion);
  put_le(b.data() + 6, uint16_t(kObjectHeaderBytes));
  put_le(b.data() + 8, h.length);
  put_le(b.data() + 16, h.checksum);
  put_le(b.data() + 24, h.version);
  put_le(b.data() + 32, binding_sum(name, std::span(b).first(32)));
  return b;
}

Result<ObjectHeader> decode_object_header(std::span<const std::byte> b, std::string_view name) {
  if (b.size() < kObjectHeaderBytes || get_le<uint32_t>(b.data()) != kObjectMagic)
    return make_status(StatusCode::corrupt_data, "object {} has no object header", name);
  if (get_le<uint16_t>(b.data() + 4) != kObjectVersion || get_le<uint16_t>(b.data() + 6) != kObjectHeaderBytes)
    return make_status(StatusCode::corrupt_data, "object {}: header version {} is not {}", name,
                       get_le<uint16_t>(b.data() + 4), kObjectVersion);
  if (get_le<uint64_t>(b.data() + 32) != binding_sum(name, b.first(32)))
    return make_status(StatusCode::corrupt_data, "object {}: header does not belong to this name", name);
  return ObjectHeader{get_le<uint64_t>(b.data() + 8), get_le<uint64_t>(b.data() + 16), get_le<uint64_t>(b.data() + 24)};
}

ObjectFile::ObjectFile(ObjectFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), header_(o.header_), dev_(o.dev_), ino_(o.ino_), name_(std::move(o.name_)) {}
ObjectFile& ObjectFile::operator=(ObjectFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    header_ = o.header_, dev_ = o.dev_, ino_ = o.ino_, name_ = std::move(o.name_);
  }
  return *this;
}
ObjectFile::~ObjectFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<ObjectFile> ObjectFile::open(const std::string& path, std::string_view name) {
  ObjectFile f;
  f.name_ = std::string(name);
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) {
    if (errno == ENOENT) return make_status(StatusCode::not_found, "no object {}", name);
    return detail::log_error(os_error("open", name, errno));
  }
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) return detail::log_error(os_error("stat", name, errno));
  f.dev_ = st.st_dev, f.ino_ = st.st_ino;
  std::array<std::byte, kObjectHeaderBytes> hb{};
  ssize_t n;
  do n = ::pread(f.fd_, hb.data(), hb.size(), 0);
  while (n < 0 && errno == EINTR);
  if (n < 0) return detail::log_error(os_error("read", name, errno));
  if (size_t(n) < hb.size()) return make_status(StatusCode::corrupt_data, "object {} is truncated on disk", name);
  KVS_ASSIGN_OR_RETURN(f.header_, decode_object_header(hb, name));
  if (uint64_t(st.st_size) != kObjectHeaderBytes + f.header_.length)
    return make_status(StatusCode::corrupt_data, "object {} is {} bytes on disk, its header says {}", name,
                       st.st_size, kObjectHeaderBytes + f.header_.length);
  return f;
}

Status ObjectFile::read(uint64_t offset, std::span<std::byte> dest) const {
  if (offset > header_.length || dest.size() > header_.length - offset)
    return make_status(StatusCode::out_of_range, "read past the end of object {}", name_);
  size_t done = 0;
  while (done < dest.size()) {
    const ssize_t n = ::pread(fd_, dest.data() + done, dest.size() - done, off_t(kObjectHeaderBytes + offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return detail::log_error(os_error("read", name_, errno));
    if (n == 0) return make_status(StatusCode::corrupt_data, "object {} ended early on disk", name_);
    done += size_t(n);
  }
  return {};
}

TempObject::TempObject(TempObject&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)),
      path_(std::move(o.path_)),
      length_(o.length_),
      written_(o.written_),
      hash_(std::exchange(o.hash_, nullptr)),
      finished_(o.finished_) {
  o.path_.clear();
}
TempObject& TempObject::operator=(TempObject&& o) noexcept {
  if (this != &o) {
    discard();
    fd_ = std::exchange(o.fd_, -1), path_ = std::move(o.path_), o.path_.clear();
    length_ = o.length_, written_ = o.written_, hash_ = std::exchange(o.hash_, nullptr), finished_ = o.finished_;
  }
  return *this;
}
TempObject::~TempObject() { discard(); }

void TempObject::discard() noexcept {
  if (fd_ >= 0) ::close(fd_), fd_ = -1;
  if (!path_.empty()) ::unlink(path_.c_str()), path_.clear();
  if (hash_) XXH3_freeState(static_cast<XXH3_state_t*>(hash_)), hash_ = nullptr;
}

Result<TempObject> TempObject::create(const std::string& dir, uint64_t length) {
  // Unique per process and call; the node holds its directory's lock, so no other
  // process writes here, and names left by a crash are removed at the next start.
  static std::atomic<uint64_t> counter{0};
  TempObject t;
  t.length_ = length;
  t.hash_ = XXH3_createState();
  if (!t.hash_) return make_status(StatusCode::resource_exhausted, "no memory for a checksum state");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(t.hash_));
  for (int attempt = 0; attempt < 16 && t.fd_ < 0; ++attempt) {
    std::string p = fmt::format("{}/w{}-{}", dir, ::getpid(), counter.fetch_add(1));
    t.fd_ = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
    if (t.fd_ >= 0) t.path_ = std::move(p);
    else if (errno != EEXIST) return detail::log_error(os_error("create", "(new)", errno));
  }
  if (t.fd_ < 0) return make_status(StatusCode::internal, "no unique temporary name");
  // Room for the header; it is written last, once the payload's checksum is known.
  if (::ftruncate(t.fd_, off_t(kObjectHeaderBytes)) != 0) return detail::log_error(os_error("create", "(new)", errno));
  return t;
}

Status TempObject::append(std::span<const std::byte> bytes) {
  if (fd_ < 0 || finished_) return make_status(StatusCode::invalid_argument, "append to a closed object");
  if (bytes.size() > length_ - written_)
    return make_status(StatusCode::out_of_range, "{} bytes past a declared length of {}", bytes.size(), length_);
  XXH3_64bits_update(static_cast<XXH3_state_t*>(hash_), bytes.data(), bytes.size());
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::pwrite(fd_, bytes.data() + done, bytes.size() - done,
                               off_t(kObjectHeaderBytes + written_ + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return detail::log_error(os_error("write", "(new)", w < 0 ? errno : EIO));
    done += size_t(w);
  }
  written_ += bytes.size();
  return {};
}

Status TempObject::finish(std::string_view name, uint64_t expected_checksum, uint64_t version) {
  if (fd_ < 0 || finished_) return make_status(StatusCode::invalid_argument, "finish of a closed object");
  if (written_ != length_)
    return make_status(StatusCode::corrupt_data, "object {}: {} of {} bytes arrived", name, written_, length_);
  const uint64_t sum = XXH3_64bits_digest(static_cast<XXH3_state_t*>(hash_));
  if (sum != expected_checksum)
    return make_status(StatusCode::corrupt_data, "object {} failed its checksum in transit", name);
  const auto h = encode_object_header(name, ObjectHeader{length_, sum, version});
  ssize_t w;
  do w = ::pwrite(fd_, h.data(), h.size(), 0);
  while (w < 0 && errno == EINTR);
  if (w != ssize_t(h.size())) return detail::log_error(os_error("write", name, w < 0 ? errno : EIO));
  if (::fsync(fd_) != 0) return detail::log_error(os_error("fsync", name, errno));
  if (::close(std::exchange(fd_, -1)) != 0) return detail::log_error(os_error("close", name, errno));
  finished_ = true;
  return {};
}

Status TempObject::rename_to(const std::string& final_path) {
  if (!finished_ || path_.empty()) return make_status(StatusCode::invalid_argument, "rename of an unfinished object");
  if (std::rename(path_.c_str(), final_path.c_str()) != 0) {
    const int e = errno;
    KVS_LOG_WARN("rename '{}' -> '{}': {}", path_, final_path, std::strerror(e));
    return os_error("rename", "(new)", e);
  }
  path_.clear();  // committed: nothing to remove
  return {};
}

Status fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    KVS_LOG_WARN("open directory '{}': {}", dir, std::strerror(e));
    return make_status(StatusCode::io_error, "sync of the store's directory: {}", std::strerror(e));
  }
  const int r = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (r == 0) return {};
  KVS_LOG_WARN("fsync directory '{}': {}", dir, std::strerror(e));
  return make_status(StatusCode::io_error, "sync of the store's directory: {}", std::strerror(e));
}

}  // namespace kvstream::storage

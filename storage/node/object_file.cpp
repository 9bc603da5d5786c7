#include "storage/node/object_file.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include "core/log.hpp"
#include "storage/protocol.hpp"

namespace kvstream::storage {

namespace {
constexpr uint32_t kObjectMagic = 0x4f53564b;  // "KVSO"
// 1 was u64 checksum + payload, unbound to its name; 2 the 40-byte header without
// parts (still read); 3 the header with its parts table.
constexpr uint16_t kObjectVersion = 3;
constexpr uint16_t kObjectVersionWithoutParts = 2;

// Errors name the object, not the file: replies carry these messages to clients.
Status os_error(std::string_view what, std::string_view object, int err) {
  return make_status(err == ENOSPC || err == EDQUOT ? StatusCode::resource_exhausted : StatusCode::io_error,
                     "{} of object {}: {}", what, object, std::strerror(err));
}

// Over the fixed fields before it, the parts table (format 3; empty for format 2) and
// the name.
uint64_t binding_sum(std::string_view name, std::span<const std::byte> first32, std::span<const std::byte> parts) {
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, first32.data(), first32.size());
  XXH3_64bits_update(&st, parts.data(), parts.size());
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

std::vector<std::byte> encode_object_header(std::string_view name, const ObjectHeader& h) {
  std::vector<std::byte> b(h.header_bytes());
  put_le(b.data(), kObjectMagic);
  put_le(b.data() + 4, kObjectVersion);
  put_le(b.data() + 6, uint16_t(b.size()));
  put_le(b.data() + 8, h.length);
  put_le(b.data() + 16, h.checksum);
  put_le(b.data() + 24, h.version);
  const auto table = encode_parts(h.parts);
  std::copy(table.begin(), table.end(), b.begin() + kObjectHeaderBytes);
  put_le(b.data() + 32, binding_sum(name, std::span(b).first(32), table));
  return b;
}

Result<ObjectHeader> decode_object_header(std::span<const std::byte> b, std::string_view name) {
  if (b.size() < kObjectHeaderBytes || get_le<uint32_t>(b.data()) != kObjectMagic)
    return make_status(StatusCode::corrupt_data, "object {} has no object header", name);
  const uint16_t format = get_le<uint16_t>(b.data() + 4), header_bytes = get_le<uint16_t>(b.data() + 6);
  if (format != kObjectVersion && format != kObjectVersionWithoutParts)
    return make_status(StatusCode::corrupt_data, "object {}: header version {} is not {} or {}", name, format,
                       kObjectVersionWithoutParts, kObjectVersion);
  const bool sized = format == kObjectVersion
                         ? header_bytes >= kObjectHeaderBytes && header_bytes <= kMaxObjectHeaderBytes &&
                               (header_bytes - kObjectHeaderBytes) % kPartWireBytes == 0
                         : header_bytes == kObjectHeaderBytes;
  if (!sized) return make_status(StatusCode::corrupt_data, "object {}: a header of {} bytes", name, header_bytes);
  if (b.size() < header_bytes) return make_status(StatusCode::corrupt_data, "object {}: header is truncated", name);
  const auto table = b.subspan(kObjectHeaderBytes, header_bytes - kObjectHeaderBytes);
  if (get_le<uint64_t>(b.data() + 32) != binding_sum(name, b.first(32), table))
    return make_status(StatusCode::corrupt_data, "object {}: header does not belong to this name", name);
  ObjectHeader h{get_le<uint64_t>(b.data() + 8), get_le<uint64_t>(b.data() + 16), get_le<uint64_t>(b.data() + 24), {}};
  KVS_ASSIGN_OR_RETURN(h.parts, decode_parts(table));
  if (Status s = validate_parts(h.parts, h.length); !s.ok())
    return make_status(StatusCode::corrupt_data, "object {}: parts table: {}", name, s.message());
  return h;
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
    return os_error("open", name, errno);
  }
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) return os_error("stat", name, errno);
  f.dev_ = st.st_dev, f.ino_ = st.st_ino;
  // The header is at most kMaxObjectHeaderBytes; a short object's payload may follow
  // it in the same read (ignored here).
  std::array<std::byte, kMaxObjectHeaderBytes> hb{};
  size_t got = 0;
  while (got < hb.size()) {
    const ssize_t n = ::pread(f.fd_, hb.data() + got, hb.size() - got, off_t(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return os_error("read", name, errno);
    if (n == 0) break;
    got += size_t(n);
  }
  if (got < kObjectHeaderBytes) return make_status(StatusCode::corrupt_data, "object {} is truncated on disk", name);
  KVS_ASSIGN_OR_RETURN(f.header_, decode_object_header(std::span(hb).first(got), name));
  if (uint64_t(st.st_size) != f.header_.header_bytes() + f.header_.length)
    return make_status(StatusCode::corrupt_data, "object {} is {} bytes on disk, its header says {}", name, st.st_size,
                       f.header_.header_bytes() + f.header_.length);
  return f;
}

Status ObjectFile::read(uint64_t offset, std::span<std::byte> dest) const {
  if (offset > header_.length || dest.size() > header_.length - offset)
    return make_status(StatusCode::out_of_range, "read past the end of object {}", name_);
  size_t done = 0;
  while (done < dest.size()) {
    const ssize_t n =
        ::pread(fd_, dest.data() + done, dest.size() - done, off_t(header_.header_bytes() + offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return os_error("read", name_, errno);
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
      parts_(std::move(o.parts_)),
      header_bytes_(o.header_bytes_),
      hash_(std::exchange(o.hash_, nullptr)),
      finished_(o.finished_) {
  o.path_.clear();
}
TempObject& TempObject::operator=(TempObject&& o) noexcept {
  if (this != &o) {
    discard();
    fd_ = std::exchange(o.fd_, -1), path_ = std::move(o.path_), o.path_.clear();
    length_ = o.length_, written_ = o.written_, hash_ = std::exchange(o.hash_, nullptr), finished_ = o.finished_;
    parts_ = std::move(o.parts_), header_bytes_ = o.header_bytes_;
  }
  return *this;
}
TempObject::~TempObject() { discard(); }

void TempObject::discard() noexcept {
  if (fd_ >= 0) ::close(fd_), fd_ = -1;
  if (!path_.empty()) ::unlink(path_.c_str()), path_.clear();
  if (hash_) XXH3_freeState(static_cast<XXH3_state_t*>(hash_)), hash_ = nullptr;
}

Result<TempObject> TempObject::create(const std::string& dir, uint64_t length, std::vector<ObjectPart> parts) {
  KVS_RETURN_IF_ERROR(validate_parts(parts, length));
  // Unique per process and call; the node holds its directory's lock, so no other
  // process writes here, and names left by a crash are removed at the next start.
  static std::atomic<uint64_t> counter{0};
  TempObject t;
  t.length_ = length;
  t.parts_ = std::move(parts);
  t.header_bytes_ = kObjectHeaderBytes + kPartWireBytes * t.parts_.size();
  t.hash_ = XXH3_createState();
  if (!t.hash_) return make_status(StatusCode::resource_exhausted, "no memory for a checksum state");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(t.hash_));
  for (int attempt = 0; attempt < 16 && t.fd_ < 0; ++attempt) {
    std::string p = fmt::format("{}/w{}-{}", dir, ::getpid(), counter.fetch_add(1));
    t.fd_ = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
    if (t.fd_ >= 0) t.path_ = std::move(p);
    else if (errno != EEXIST) return os_error("create", "(new)", errno);
  }
  if (t.fd_ < 0) return make_status(StatusCode::internal, "no unique temporary name");
  // Room for the header; it is written last, once the payload's checksum is known.
  if (::ftruncate(t.fd_, off_t(t.header_bytes_)) != 0) return os_error("create", "(new)", errno);
  return t;
}

Status TempObject::append(std::span<const std::byte> bytes) {
  if (fd_ < 0 || finished_) return make_status(StatusCode::invalid_argument, "append to a closed object");
  if (bytes.size() > length_ - written_)
    return make_status(StatusCode::out_of_range, "{} bytes past a declared length of {}", bytes.size(), length_);
  XXH3_64bits_update(static_cast<XXH3_state_t*>(hash_), bytes.data(), bytes.size());
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, off_t(header_bytes_ + written_ + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return os_error("write", "(new)", w < 0 ? errno : EIO);
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
  const auto h = encode_object_header(name, ObjectHeader{length_, sum, version, parts_});
  ssize_t w;
  do w = ::pwrite(fd_, h.data(), h.size(), 0);
  while (w < 0 && errno == EINTR);
  if (w != ssize_t(h.size())) return os_error("write", name, w < 0 ? errno : EIO);
  if (::fsync(fd_) != 0) return os_error("fsync", name, errno);
  if (::close(std::exchange(fd_, -1)) != 0) return os_error("close", name, errno);
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

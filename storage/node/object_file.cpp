#include "storage/node/object_file.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include "core/log.hpp"
#include "storage/protocol.hpp"

namespace kvstream::storage {

namespace {
constexpr uint32_t kObjectMagic = 0x4f53564b;  // "KVSO"
// 1 was u64 checksum + payload, unbound to its name; 2 the 40-byte header without
// parts (still read); 3 the header with its parts table; 4 sealed (object_seal.hpp),
// written when the node has a key file.
constexpr uint16_t kObjectVersion = 3;
constexpr uint16_t kObjectVersionWithoutParts = 2;
constexpr uint16_t kObjectVersionSealed = 4;
// Block sizes a sealed header may declare: they size the buffers of a read.
constexpr uint32_t kMinSealBlock = 1 << 10, kMaxSealBlock = 1 << 20;
constexpr size_t kSealedBindingAt = 72;  // the binding's offset in a format-4 header
constexpr size_t kSealedAdBytes = 48;    // fields the checksum's seal binds (before the sealed checksum)
constexpr size_t kMaxClearHeaderBytes = kObjectHeaderBytes + kPartWireBytes * kMaxObjectParts;  // format 3

// Errors name the object, not the file: replies carry these messages to clients.
Status os_error(std::string_view what, std::string_view object, int err) {
  return make_status(err == ENOSPC || err == EDQUOT ? StatusCode::no_space : StatusCode::io_error,
                     "{} of object {}: {}", what, object, std::strerror(err));
}

// Over the fixed fields before it, the parts table (formats 3 and 4; empty for format
// 2) and the name.
uint64_t binding_sum(std::string_view name, std::span<const std::byte> fields, std::span<const std::byte> parts) {
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, fields.data(), fields.size());
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

// A format-4 header's first 48 bytes, before its sealed checksum.
std::array<std::byte, kSealedAdBytes> sealed_fields(const ObjectHeader& h, size_t header_bytes) {
  std::array<std::byte, kSealedAdBytes> b{};
  put_le(b.data(), kObjectMagic);
  put_le(b.data() + 4, kObjectVersionSealed);
  put_le(b.data() + 6, uint16_t(header_bytes));
  put_le(b.data() + 8, h.length);
  put_le(b.data() + 16, h.version);
  put_le(b.data() + 24, h.key_id);
  put_le(b.data() + 28, h.block_bytes);
  std::memcpy(b.data() + 32, h.nonce.data(), h.nonce.size());
  return b;  // bytes 44..47 stay zero
}

// What the checksum's seal binds: those 48 bytes, the parts table and the name.
std::vector<std::byte> sealed_header_ad(std::string_view name, const ObjectHeader& h) {
  const auto fields = sealed_fields(h, h.header_bytes());
  const auto table = encode_parts(h.parts);
  std::vector<std::byte> ad(fields.size() + table.size() + name.size());
  std::memcpy(ad.data(), fields.data(), fields.size());
  if (!table.empty()) std::memcpy(ad.data() + fields.size(), table.data(), table.size());
  if (!name.empty()) std::memcpy(ad.data() + fields.size() + table.size(), name.data(), name.size());
  return ad;
}

Result<ObjectHeader> decode_sealed_header(std::span<const std::byte> b, std::string_view name) {
  const uint16_t header_bytes = get_le<uint16_t>(b.data() + 6);
  if (header_bytes < kSealedObjectHeaderBytes || header_bytes > kMaxObjectHeaderBytes ||
      (header_bytes - kSealedObjectHeaderBytes) % kPartWireBytes != 0)
    return make_status(StatusCode::corrupt_data, "object {}: a header of {} bytes", name, header_bytes);
  if (b.size() < header_bytes) return make_status(StatusCode::corrupt_data, "object {}: header is truncated", name);
  const auto table = b.subspan(kSealedObjectHeaderBytes, header_bytes - kSealedObjectHeaderBytes);
  if (get_le<uint64_t>(b.data() + kSealedBindingAt) != binding_sum(name, b.first(kSealedBindingAt), table))
    return make_status(StatusCode::corrupt_data, "object {}: header does not belong to this name", name);
  ObjectHeader h;
  h.length = get_le<uint64_t>(b.data() + 8);
  h.version = get_le<uint64_t>(b.data() + 16);
  h.key_id = get_le<uint32_t>(b.data() + 24);
  h.block_bytes = get_le<uint32_t>(b.data() + 28);
  std::memcpy(h.nonce.data(), b.data() + 32, h.nonce.size());
  std::memcpy(h.sealed_checksum.cipher.data(), b.data() + 48, 8);
  std::memcpy(h.sealed_checksum.tag.data(), b.data() + 56, security::kTagBytes);
  // Bounded before any size is computed from them (the structure is all the scan checks
  // of an object whose key is missing).
  if (h.key_id == 0 || h.block_bytes < kMinSealBlock || h.block_bytes > kMaxSealBlock || h.length > kMaxChunkBytes ||
      get_le<uint32_t>(b.data() + 44) != 0)
    return make_status(StatusCode::corrupt_data, "object {}: a sealed header of {} bytes in blocks of {} under key {}",
                       name, h.length, h.block_bytes, h.key_id);
  KVS_ASSIGN_OR_RETURN(h.parts, decode_parts(table));
  if (Status s = validate_parts(h.parts, h.length); !s.ok())
    return make_status(StatusCode::corrupt_data, "object {}: parts table: {}", name, s.message());
  return h;
}

// preadv until every vector is full. Errors: io_error, corrupt_data (the file ended).
Status preadv_all(int fd, iovec* iov, int count, off_t at, std::string_view name) {
  while (count > 0) {
    const ssize_t n = ::preadv(fd, iov, count, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return os_error("read", name, errno);
    if (n == 0) return make_status(StatusCode::corrupt_data, "object {} ended early on disk", name);
    at += n;
    for (size_t left = size_t(n); left > 0;) {
      const size_t step = std::min(left, iov->iov_len);
      iov->iov_base = static_cast<char*>(iov->iov_base) + step, iov->iov_len -= step, left -= step;
      if (iov->iov_len == 0) ++iov, --count;
    }
    while (count > 0 && iov->iov_len == 0) ++iov, --count;
  }
  return {};
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

Result<std::vector<std::byte>> encode_sealed_object_header(std::string_view name, ObjectHeader h,
                                                           const ObjectSeal& seal) {
  h.key_id = seal.key_id, h.block_bytes = seal.block_bytes, h.nonce = seal.base;
  const auto ad = sealed_header_ad(name, h);
  KVS_ASSIGN_OR_RETURN(h.sealed_checksum, seal_checksum(seal, ad, h.checksum));
  std::vector<std::byte> b(h.header_bytes());
  std::copy(ad.begin(), ad.begin() + kSealedAdBytes, b.begin());
  std::memcpy(b.data() + 48, h.sealed_checksum.cipher.data(), 8);
  std::memcpy(b.data() + 56, h.sealed_checksum.tag.data(), security::kTagBytes);
  const auto table = std::span(ad).subspan(kSealedAdBytes, b.size() - kSealedObjectHeaderBytes);
  std::copy(table.begin(), table.end(), b.begin() + kSealedObjectHeaderBytes);
  put_le(b.data() + kSealedBindingAt, binding_sum(name, std::span(b).first(kSealedBindingAt), table));
  return b;
}

Result<uint64_t> open_sealed_checksum(std::string_view name, const ObjectHeader& h, const ObjectSeal& seal) {
  return open_checksum(seal, sealed_header_ad(name, h), h.sealed_checksum, name);
}

Result<ObjectHeader> decode_object_header(std::span<const std::byte> b, std::string_view name) {
  if (b.size() < kObjectHeaderBytes || get_le<uint32_t>(b.data()) != kObjectMagic)
    return make_status(StatusCode::corrupt_data, "object {} has no object header", name);
  const uint16_t format = get_le<uint16_t>(b.data() + 4), header_bytes = get_le<uint16_t>(b.data() + 6);
  if (format == kObjectVersionSealed) return decode_sealed_header(b, name);
  if (format != kObjectVersion && format != kObjectVersionWithoutParts)
    return make_status(StatusCode::corrupt_data, "object {}: header version {} is not {}, {} or {}", name, format,
                       kObjectVersionWithoutParts, kObjectVersion, kObjectVersionSealed);
  const bool sized = format == kObjectVersion
                         ? header_bytes >= kObjectHeaderBytes && header_bytes <= kMaxClearHeaderBytes &&
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
    : fd_(std::exchange(o.fd_, -1)),
      header_(std::move(o.header_)),
      dev_(o.dev_),
      ino_(o.ino_),
      name_(std::move(o.name_)),
      seal_(std::move(o.seal_)),
      unreadable_(std::move(o.unreadable_)) {}
ObjectFile& ObjectFile::operator=(ObjectFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    header_ = std::move(o.header_), dev_ = o.dev_, ino_ = o.ino_, name_ = std::move(o.name_);
    seal_ = std::move(o.seal_), unreadable_ = std::move(o.unreadable_);
  }
  return *this;
}
ObjectFile::~ObjectFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<ObjectFile> ObjectFile::open(const std::string& path, std::string_view name, const security::KeyRing* keys,
                                    KeyCheck check) {
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
  if (uint64_t(st.st_size) != f.header_.header_bytes() + f.header_.stored_bytes())
    return make_status(StatusCode::corrupt_data, "object {} is {} bytes on disk, its header says {}", name, st.st_size,
                       f.header_.header_bytes() + f.header_.stored_bytes());
  if (!f.sealed()) return f;
  auto seal = stored_object_seal(keys, f.header_.key_id, namespace_of(name), f.header_.nonce, f.header_.block_bytes,
                                 name);
  if (!seal.ok()) {
    // The start-up scan indexes an object it cannot read (its structure verified): the
    // key may come back with the next key file.
    if (seal.status().code() != StatusCode::permission_denied || check == KeyCheck::required) return seal.status();
    f.unreadable_ = seal.status();
    return f;
  }
  KVS_ASSIGN_OR_RETURN(f.header_.checksum, open_sealed_checksum(name, f.header_, *seal));
  f.seal_ = std::move(seal).value();
  return f;
}

Status ObjectFile::read(uint64_t offset, std::span<std::byte> dest) const {
  if (offset > header_.length || dest.size() > header_.length - offset)
    return make_status(StatusCode::out_of_range, "read past the end of object {}", name_);
  if (sealed()) return seal_ ? read_sealed(offset, dest) : unreadable_;
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

// The blocks the range covers, read a batch at a time with one preadv each: a block
// wholly inside `dest` lands there and is opened in place; the range's first and last
// block, when it covers them only in part, pass through a scratch buffer.
Status ObjectFile::read_sealed(uint64_t offset, std::span<std::byte> dest) const {
  if (dest.empty()) return {};
  const ObjectSeal& s = *seal_;
  const uint64_t block = s.block_bytes, stride = block + security::kTagBytes;
  const uint64_t end = offset + dest.size(), first = offset / block, last = (end - 1) / block;
  const uint64_t final_block = sealed_blocks(header_.length, s.block_bytes) - 1;
  constexpr size_t kBatch = 4;  // blocks per preadv
  std::array<security::Tag, kBatch> tags;
  std::array<iovec, 2 * kBatch> iov;
  std::vector<std::byte> scratch;  // slot 0: a partial first block, slot 1: a partial last one
  BlockAd ad(name_);
  for (uint64_t b0 = first; b0 <= last; b0 += kBatch) {
    const uint64_t b1 = std::min(last + 1, b0 + kBatch);
    int n = 0;
    for (uint64_t b = b0; b < b1; ++b) {
      const uint64_t at = b * block, len = std::min(block, header_.length - at);
      if (at >= offset && at + len <= end) {
        iov[n++] = {dest.data() + (at - offset), len};
        iov[n++] = {tags[b - b0].data(), security::kTagBytes};
      } else {
        if (scratch.empty()) scratch.resize(2 * stride);
        iov[n++] = {scratch.data() + (b == first ? 0 : stride), len + security::kTagBytes};
      }
    }
    KVS_RETURN_IF_ERROR(preadv_all(fd_, iov.data(), n, off_t(header_.header_bytes() + b0 * stride), name_));
    for (uint64_t b = b0; b < b1; ++b) {
      const uint64_t at = b * block, len = std::min(block, header_.length - at);
      if (at >= offset && at + len <= end) {
        KVS_RETURN_IF_ERROR(open_block(s, ad, b, b == final_block, dest.subspan(at - offset, len), tags[b - b0], name_));
        continue;
      }
      std::byte* slot = scratch.data() + (b == first ? 0 : stride);
      security::Tag tag;
      std::memcpy(tag.data(), slot + len, tag.size());
      KVS_RETURN_IF_ERROR(open_block(s, ad, b, b == final_block, std::span(slot, len), tag, name_));
      const uint64_t from = std::max(at, offset), to = std::min(at + len, end);
      std::memcpy(dest.data() + (from - offset), slot + (from - at), to - from);
    }
  }
  return {};
}

TempObject::TempObject(TempObject&& o) noexcept { *this = std::move(o); }
TempObject& TempObject::operator=(TempObject&& o) noexcept {
  if (this != &o) {
    discard();
    fd_ = std::exchange(o.fd_, -1), path_ = std::move(o.path_), o.path_.clear();
    length_ = o.length_, written_ = o.written_, hash_ = std::exchange(o.hash_, nullptr), finished_ = o.finished_;
    parts_ = std::move(o.parts_), header_bytes_ = o.header_bytes_;
    seal_ = std::move(o.seal_), name_ = std::move(o.name_), block_ = std::move(o.block_), filled_ = o.filled_;
  }
  return *this;
}
TempObject::~TempObject() { discard(); }

void TempObject::discard() noexcept {
  if (fd_ >= 0) ::close(fd_), fd_ = -1;
  if (!path_.empty()) ::unlink(path_.c_str()), path_.clear();
  if (hash_) XXH3_freeState(static_cast<XXH3_state_t*>(hash_)), hash_ = nullptr;
}

Result<TempObject> TempObject::create(const std::string& dir, uint64_t length, std::vector<ObjectPart> parts,
                                      std::optional<ObjectSeal> seal, std::string_view name) {
  KVS_RETURN_IF_ERROR(validate_parts(parts, length));
  // Unique per process and call; the node holds its directory's lock, so no other
  // process writes here, and names left by a crash are removed at the next start.
  static std::atomic<uint64_t> counter{0};
  TempObject t;
  t.length_ = length;
  t.parts_ = std::move(parts);
  t.header_bytes_ = (seal ? kSealedObjectHeaderBytes : kObjectHeaderBytes) + kPartWireBytes * t.parts_.size();
  if (seal) {
    if (name.empty()) return make_status(StatusCode::invalid_argument, "a sealed object needs its name at create");
    t.seal_ = std::move(seal);
    t.name_ = std::string(name);
    // One block's plaintext and tag: what a put holds beside its segment.
    t.block_.resize(std::min<uint64_t>(length, t.seal_->block_bytes) + security::kTagBytes);
  }
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
  if (seal_) return append_sealed(bytes);
  KVS_RETURN_IF_ERROR(write_at(bytes, header_bytes_ + written_));
  written_ += bytes.size();
  return {};
}

Status TempObject::write_at(std::span<const std::byte> bytes, uint64_t file_offset) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, off_t(file_offset + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return os_error("write", "(new)", w < 0 ? errno : EIO);
    done += size_t(w);
  }
  return {};
}

// Fills the current block; each block is sealed (in place, its tag after it) and
// written as soon as it is complete, so at most one block's plaintext is ever held.
// The length is declared up front, so the last block is known when it is sealed.
Status TempObject::append_sealed(std::span<const std::byte> bytes) {
  const uint64_t block = seal_->block_bytes, last = sealed_blocks(length_, seal_->block_bytes) - 1;
  BlockAd ad(name_);
  while (!bytes.empty()) {
    const uint64_t index = written_ / block, len = std::min(block, length_ - index * block);
    const size_t take = std::min<uint64_t>(bytes.size(), len - filled_);
    std::memcpy(block_.data() + filled_, bytes.data(), take);
    filled_ += take, written_ += take, bytes = bytes.subspan(take);
    if (filled_ < len) continue;
    KVS_ASSIGN_OR_RETURN(const auto tag, seal_block(*seal_, ad, index, index == last, std::span(block_).first(len)));
    std::memcpy(block_.data() + len, tag.data(), tag.size());
    KVS_RETURN_IF_ERROR(
        write_at(std::span(block_).first(len + tag.size()), header_bytes_ + index * (block + security::kTagBytes)));
    filled_ = 0;
  }
  return {};
}

Status TempObject::finish(std::string_view name, uint64_t expected_checksum, uint64_t version) {
  if (fd_ < 0 || finished_) return make_status(StatusCode::invalid_argument, "finish of a closed object");
  if (written_ != length_)
    return make_status(StatusCode::corrupt_data, "object {}: {} of {} bytes arrived", name, written_, length_);
  const uint64_t sum = XXH3_64bits_digest(static_cast<XXH3_state_t*>(hash_));
  if (sum != expected_checksum)
    return make_status(StatusCode::corrupt_data, "object {} failed its checksum in transit", name);
  if (seal_ && name != name_)
    return make_status(StatusCode::invalid_argument, "object {} was sealed for the name {}", name, name_);
  std::vector<std::byte> h;
  if (seal_) {
    KVS_ASSIGN_OR_RETURN(h, encode_sealed_object_header(name, ObjectHeader{length_, sum, version, parts_}, *seal_));
  } else {
    h = encode_object_header(name, ObjectHeader{length_, sum, version, parts_});
  }
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

int write_all(int fd, std::string_view bytes) {
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n >= 0) done += size_t(n);
    else if (errno != EINTR) return errno;
  }
  return 0;
}

int replace_file(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  int e = write_all(fd, bytes);
  if (e == 0 && ::fsync(fd) != 0) e = errno;
  ::close(fd);
  if (e == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) e = errno;
  if (e != 0) ::unlink(tmp.c_str());
  return e;
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

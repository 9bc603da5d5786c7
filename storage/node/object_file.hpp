// One stored object on disk: a header that binds the object's name, length and parts
// table under a checksum, then the payload (in clear, or sealed in blocks under the
// tenant's key: object_seal.hpp). Written through a uniquely named temporary file
// that is renamed into place only when complete and synced; read through an open
// descriptor, so a reader keeps the version it opened while writers replace the name.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvstream/status.hpp"
#include "kvstream/storage.hpp"
#include "storage/node/object_seal.hpp"

namespace kvstream::storage {

/// Bytes of the object header's fixed part: u32 magic "KVSO", u16 format version, u16
/// header bytes (the payload's offset), u64 payload length, u64 xxh3-64 of the payload
/// (what the wire carries), u64 write version, u64 binding: xxh3-64 of the preceding 32
/// bytes, the parts table and the name (so a copied or renamed file, or a changed
/// table, fails). Format 3 follows it with the parts table, (u64 end, f64 score) per
/// part, so header bytes = 40 + 16 x parts; format 2 (written before parts existed)
/// has header bytes 40, no table and a binding over the 32 bytes and the name, and is
/// still read (as an object without parts). docs/protocol.md, "Storage on disk".
inline constexpr size_t kObjectHeaderBytes = 40;
/// The fixed part of format 4 (sealed, object_seal.hpp): u32 magic, u16 format 4, u16
/// header bytes, u64 length, u64 write version, u32 key id, u32 block bytes, 12 bytes
/// base nonce, u32 zero, the sealed checksum (8 bytes and a 16-byte tag, over bytes
/// 0..47, the parts table and the name), u64 binding (xxh3-64 of bytes 0..71, the
/// table and the name), then the parts table. The payload follows as sealed blocks.
inline constexpr size_t kSealedObjectHeaderBytes = 80;
/// The largest header: the sealed fixed part and a full parts table.
inline constexpr size_t kMaxObjectHeaderBytes = kSealedObjectHeaderBytes + 16 * kMaxObjectParts;

/// What an object header says, once its binding to `name` is verified.
struct ObjectHeader {
  uint64_t length = 0;
  uint64_t checksum = 0;  ///< xxh3-64 of the payload
  uint64_t version = 0;   ///< the write's version (protocol: Request::version)
  std::vector<ObjectPart> parts;  ///< the parts table declared at put (validate_parts against length)
  /// Format 4: the master key it is sealed under (0: clear, formats 2 and 3), its base
  /// nonce, block size and sealed checksum (`checksum` is known once that is opened).
  uint32_t key_id = 0;
  uint32_t block_bytes = 0;
  security::Nonce nonce{};
  SealedChecksum sealed_checksum;
  /// Bytes before the payload (the fixed part + 16 x parts).
  [[nodiscard]] uint64_t header_bytes() const {
    return (key_id ? kSealedObjectHeaderBytes : kObjectHeaderBytes) + 16 * parts.size();
  }
  /// Bytes of the payload on disk (sealed: each block with its tag).
  [[nodiscard]] uint64_t stored_bytes() const { return key_id ? sealed_bytes(length, block_bytes) : length; }
};

/// The header (format 3) of an object called `name` with this payload and parts.
std::vector<std::byte> encode_object_header(std::string_view name, const ObjectHeader& h);
/// The header (format 4) of an object called `name` sealed with `seal` (which sets the
/// key id, nonce and block size; h.checksum is sealed). Errors: internal.
Result<std::vector<std::byte>> encode_sealed_object_header(std::string_view name, ObjectHeader h,
                                                           const ObjectSeal& seal);
/// Parses and verifies a header read from disk (at least its header bytes; more is
/// ignored) against the object's `name`: format 3, format 2 (no parts) or format 4
/// (its structure and binding only: open_sealed_checksum verifies its seal). Errors:
/// corrupt_data (magic, version, header size, binding checksum or parts table wrong,
/// or fewer bytes than the header declares).
Result<ObjectHeader> decode_object_header(std::span<const std::byte> bytes, std::string_view name);
/// The checksum of a format-4 header, once its seal verifies under `seal`. Errors:
/// corrupt_data (the header was changed or is another name's), internal.
Result<uint64_t> open_sealed_checksum(std::string_view name, const ObjectHeader& h, const ObjectSeal& seal);

/// Whether ObjectFile::open needs the key of a sealed object.
enum class KeyCheck {
  required,      ///< a missing key fails the open (permission_denied)
  when_present,  ///< a missing key leaves the object open but unreadable (the start-up scan)
};

/// An open, verified object (RAII: closes its descriptor). The version it holds does
/// not change when the name is replaced or removed.
class ObjectFile {
 public:
  ObjectFile() = default;
  ObjectFile(ObjectFile&& o) noexcept;
  ObjectFile& operator=(ObjectFile&& o) noexcept;
  ~ObjectFile();

  /// Opens `path` and checks its header against `name` and its length against the
  /// file's size; a sealed object's header seal is verified under `keys` (its tenant is
  /// the name's namespace). Errors: not_found, corrupt_data (truncated, wrong header or
  /// seal), permission_denied (sealed under a key `keys` lacks, with `check` required),
  /// io_error. Messages name the object (`name`), never the server's path.
  static Result<ObjectFile> open(const std::string& path, std::string_view name,
                                 const security::KeyRing* keys = nullptr, KeyCheck check = KeyCheck::required);

  [[nodiscard]] const ObjectHeader& header() const { return header_; }
  [[nodiscard]] uint64_t size() const { return header_.length; }
  /// Sealed (format 4): reads decrypt, and a range costs only the blocks it covers.
  [[nodiscard]] bool sealed() const { return header_.key_id != 0; }
  /// Device and inode: identify the version this descriptor holds.
  [[nodiscard]] std::pair<uint64_t, uint64_t> identity() const { return {dev_, ino_}; }
  /// Reads payload bytes [offset, offset + dest.size()), decrypting the blocks they
  /// cover when sealed. Errors: io_error, corrupt_data (the file ended early, a block
  /// failed its authentication: `dest` then holds nothing usable), permission_denied
  /// (opened without its key).
  Status read(uint64_t offset, std::span<std::byte> dest) const;

 private:
  Status read_sealed(uint64_t offset, std::span<std::byte> dest) const;
  int fd_ = -1;
  ObjectHeader header_;
  uint64_t dev_ = 0, ino_ = 0;
  std::string name_;
  std::optional<ObjectSeal> seal_;  // sealed and its key at hand
  Status unreadable_;               // sealed, opened without its key (KeyCheck::when_present)
};

/// An object being written (RAII: the temporary file is removed unless committed).
/// Appends hash as they go, so the payload is never held whole in memory.
class TempObject {
 public:
  TempObject() = default;
  TempObject(TempObject&& o) noexcept;
  TempObject& operator=(TempObject&& o) noexcept;
  ~TempObject();

  /// Creates a uniquely named temporary file in `dir` (which must exist) for an object
  /// of `length` payload bytes with this parts table (written into the header at
  /// finish). With `seal`, the object is written sealed (format 4) for `name` (the
  /// name finish must be given: blocks are sealed as they arrive, bound to it).
  /// Errors: invalid_argument (parts that fail validate_parts), io_error,
  /// no_space (disk full).
  static Result<TempObject> create(const std::string& dir, uint64_t length, std::vector<ObjectPart> parts = {},
                                   std::optional<ObjectSeal> seal = std::nullopt, std::string_view name = {});
  /// Appends payload bytes. Errors: out_of_range (past the declared length), io_error,
  /// no_space.
  Status append(std::span<const std::byte> bytes);
  /// Writes the header (with the parts table) for `name` and `version`, checks the payload is complete and
  /// matches `expected_checksum` (of the plaintext), and fsyncs. Errors: corrupt_data
  /// (checksum or length), invalid_argument (a sealed object finished under another
  /// name than it was created for), io_error.
  Status finish(std::string_view name, uint64_t expected_checksum, uint64_t version);
  /// Renames the finished file to `final_path` (same file system); the caller syncs the
  /// directory. Errors: io_error.
  Status rename_to(const std::string& final_path);

  [[nodiscard]] uint64_t written() const { return written_; }
  [[nodiscard]] const std::vector<ObjectPart>& parts() const { return parts_; }
  /// The master key it is sealed under (0: clear).
  [[nodiscard]] uint32_t key_id() const { return seal_ ? seal_->key_id : 0; }

 private:
  void discard() noexcept;
  Status write_at(std::span<const std::byte> bytes, uint64_t file_offset);
  Status append_sealed(std::span<const std::byte> bytes);
  int fd_ = -1;
  std::string path_;
  uint64_t length_ = 0, written_ = 0;
  std::vector<ObjectPart> parts_;
  uint64_t header_bytes_ = kObjectHeaderBytes;
  void* hash_ = nullptr;  // XXH3_state_t (kept out of the header)
  bool finished_ = false;
  // Sealed: the block being filled (its plaintext, then sealed in place with its tag
  // after it) and how much of it has arrived.
  std::optional<ObjectSeal> seal_;
  std::string name_;
  std::vector<std::byte> block_;
  size_t filled_ = 0;
};

/// fsync of a directory, so a rename or unlink in it is durable. Errors: io_error.
Status fsync_directory(const std::string& dir);

/// Writes all of `bytes` at `fd`'s position (again after a short write or EINTR).
/// Returns 0, or the errno of the write that failed.
int write_all(int fd, std::string_view bytes);

/// Writes `bytes` to `<path>.tmp`, syncs it and renames it over `path`, so a crash
/// leaves the old file or the new one (the store's small files: its remembered
/// removes, its member mark). Returns 0, or the errno of the step that failed (the
/// temporary file removed); the directory is not synced.
int replace_file(const std::string& path, std::string_view bytes);

}  // namespace kvstream::storage

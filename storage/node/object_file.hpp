// One stored object on disk: a header that binds the object's name, length and parts
// table under a checksum, then the payload. Written through a uniquely named temporary file
// that is renamed into place only when complete and synced; read through an open
// descriptor, so a reader keeps the version it opened while writers replace the name.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvstream/status.hpp"
#include "kvstream/storage.hpp"

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
/// The largest header: the fixed part and a full parts table.
inline constexpr size_t kMaxObjectHeaderBytes = kObjectHeaderBytes + 16 * kMaxObjectParts;

/// What an object header says, once its binding to `name` is verified.
struct ObjectHeader {
  uint64_t length = 0;
  uint64_t checksum = 0;  ///< xxh3-64 of the payload
  uint64_t version = 0;   ///< the write's version (protocol: Request::version)
  std::vector<ObjectPart> parts;  ///< the parts table declared at put (validate_parts against length)
  /// Bytes before the payload (kObjectHeaderBytes + 16 x parts).
  [[nodiscard]] uint64_t header_bytes() const { return kObjectHeaderBytes + 16 * parts.size(); }
};

/// The header (format 3) of an object called `name` with this payload and parts.
std::vector<std::byte> encode_object_header(std::string_view name, const ObjectHeader& h);
/// Parses and verifies a header read from disk (at least its header bytes; more is
/// ignored) against the object's `name`: format 3, or format 2 (no parts). Errors:
/// corrupt_data (magic, version, header size, binding checksum or parts table wrong,
/// or fewer bytes than the header declares).
Result<ObjectHeader> decode_object_header(std::span<const std::byte> bytes, std::string_view name);

/// An open, verified object (RAII: closes its descriptor). The version it holds does
/// not change when the name is replaced or removed.
class ObjectFile {
 public:
  ObjectFile() = default;
  ObjectFile(ObjectFile&& o) noexcept;
  ObjectFile& operator=(ObjectFile&& o) noexcept;
  ~ObjectFile();

  /// Opens `path` and checks its header against `name` and its length against the
  /// file's size. Errors: not_found, corrupt_data (truncated, wrong header), io_error.
  /// Messages name the object (`name`), never the server's path.
  static Result<ObjectFile> open(const std::string& path, std::string_view name);

  [[nodiscard]] const ObjectHeader& header() const { return header_; }
  [[nodiscard]] uint64_t size() const { return header_.length; }
  /// Device and inode: identify the version this descriptor holds.
  [[nodiscard]] std::pair<uint64_t, uint64_t> identity() const { return {dev_, ino_}; }
  /// Reads payload bytes [offset, offset + dest.size()). Errors: io_error, corrupt_data
  /// (the file ended early).
  Status read(uint64_t offset, std::span<std::byte> dest) const;

 private:
  int fd_ = -1;
  ObjectHeader header_;
  uint64_t dev_ = 0, ino_ = 0;
  std::string name_;
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
  /// finish). Errors: invalid_argument (parts that fail validate_parts), io_error,
  /// resource_exhausted (disk full).
  static Result<TempObject> create(const std::string& dir, uint64_t length, std::vector<ObjectPart> parts = {});
  /// Appends payload bytes. Errors: out_of_range (past the declared length), io_error,
  /// resource_exhausted.
  Status append(std::span<const std::byte> bytes);
  /// Writes the header (with the parts table) for `name` and `version`, checks the payload is complete and
  /// matches `expected_checksum`, and fsyncs. Errors: corrupt_data (checksum or
  /// length), io_error.
  Status finish(std::string_view name, uint64_t expected_checksum, uint64_t version);
  /// Renames the finished file to `final_path` (same file system); the caller syncs the
  /// directory. Errors: io_error.
  Status rename_to(const std::string& final_path);

  [[nodiscard]] uint64_t written() const { return written_; }
  [[nodiscard]] const std::vector<ObjectPart>& parts() const { return parts_; }

 private:
  void discard() noexcept;
  int fd_ = -1;
  std::string path_;
  uint64_t length_ = 0, written_ = 0;
  std::vector<ObjectPart> parts_;
  uint64_t header_bytes_ = kObjectHeaderBytes;
  void* hash_ = nullptr;  // XXH3_state_t (kept out of the header)
  bool finished_ = false;
};

/// fsync of a directory, so a rename or unlink in it is durable. Errors: io_error.
Status fsync_directory(const std::string& dir);

}  // namespace kvstream::storage

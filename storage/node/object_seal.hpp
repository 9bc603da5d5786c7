// Encryption at rest of one stored object (format 4, docs/protocol.md "Storage on
// disk"): the payload in blocks of 64 KiB of plaintext, each sealed with AES-256-GCM
// under the tenant's key, and the payload's checksum sealed beside the header.
//
// Block i is sealed with nonce_for(base, i + 1) and associated data = the object's
// name, i and whether it is the last block: a block moved within an object, to another
// object, or a payload cut at a block boundary fails its tag. The checksum uses
// nonce_for(base, 0) and binds the header's fields and the name, so a header edited or
// copied to another name fails too, even with its xxh3 binding recomputed. The base
// nonce is random per object (per write), so no (key, nonce) pair repeats.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kvstream/status.hpp"
#include "security/aead.hpp"
#include "security/key_ring.hpp"

namespace kvstream::storage {

/// Plaintext bytes per sealed block (the last one may be shorter).
inline constexpr uint32_t kSealBlockBytes = 64 << 10;

/// What seals one object: the tenant key derived from master key `key_id` (never 0:
/// 0 means clear) and the object's base nonce.
struct ObjectSeal {
  uint32_t key_id = 0;
  security::Key256 key{};
  security::Nonce base{};
  uint32_t block_bytes = kSealBlockBytes;
};

/// A fresh seal for a write of namespace `ns` under `keys`' current key.
/// Errors: internal (no entropy, HKDF failed).
Result<ObjectSeal> new_object_seal(const security::KeyRing& keys, std::string_view ns);
/// The seal of a stored object sealed under `key_id` with `base`. Errors:
/// permission_denied naming `object` when the key file lacks `key_id` (the object is
/// not damaged: this node cannot read it), internal.
Result<ObjectSeal> stored_object_seal(const security::KeyRing* keys, uint32_t key_id, std::string_view ns,
                                      const security::Nonce& base, uint32_t block_bytes, std::string_view object);

/// The namespace of an object name "ns/ctx/c<chunk>.l<level>": the tenant whose key seals it.
std::string_view namespace_of(std::string_view object_name);

/// Blocks of a payload of `length` bytes (0 for an empty one), and the bytes they take
/// on disk (each block's ciphertext and its tag).
[[nodiscard]] constexpr uint64_t sealed_blocks(uint64_t length, uint32_t block_bytes) {
  return (length + block_bytes - 1) / block_bytes;
}
[[nodiscard]] constexpr uint64_t sealed_bytes(uint64_t length, uint32_t block_bytes) {
  return length + security::kTagBytes * sealed_blocks(length, block_bytes);
}

/// The associated data of one object's blocks: its name, then the block's index and
/// last-block flag, rewritten per block (one buffer per read or write, not per block).
class BlockAd {
 public:
  explicit BlockAd(std::string_view name);
  std::span<const std::byte> at(uint64_t index, bool last);

 private:
  std::vector<std::byte> bytes_;
  size_t name_bytes_ = 0;
};

/// Seals block `index` in place (ciphertext replaces plaintext); returns its tag.
/// Errors: internal.
Result<security::Tag> seal_block(const ObjectSeal& s, BlockAd& ad, uint64_t index, bool last,
                                 std::span<std::byte> bytes);
/// Opens block `index` in place. Errors: corrupt_data naming `object` and the block
/// (bytes changed, moved, or sealed for another object), internal.
Status open_block(const ObjectSeal& s, BlockAd& ad, uint64_t index, bool last, std::span<std::byte> bytes,
                  const security::Tag& tag, std::string_view object);

/// The payload checksum sealed as 8 bytes of ciphertext and their tag, under `header_ad`
/// (the header's fields, parts table and the name).
struct SealedChecksum {
  std::array<std::byte, 8> cipher{};
  security::Tag tag{};
};
Result<SealedChecksum> seal_checksum(const ObjectSeal& s, std::span<const std::byte> header_ad, uint64_t checksum);
/// Errors: corrupt_data naming `object` (the header was changed or belongs to another
/// name), internal.
Result<uint64_t> open_checksum(const ObjectSeal& s, std::span<const std::byte> header_ad, const SealedChecksum& sealed,
                               std::string_view object);

}  // namespace kvstream::storage

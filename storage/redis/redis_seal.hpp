// Encryption at rest of the values the Redis clients store (RedisConfig::at_rest):
// the sealed layout and opening it, whole or block by block. Internal to the Redis
// clients; redis_value.cpp decides which values go through it.
//
// A sealed value, in place of the clear one (checksum, payload):
//   "kvsAEv1\0"             8 bytes: marks the value as sealed
//   key id                  u32 little-endian: the master key (KeyRing) it is under
//   nonce                   12 random bytes, fresh per value
//   block 0, tag 0, ...     the payload in 64 KiB blocks (kBlockBytes), each
//                           AES-256-GCM-encrypted under the namespace's tenant key
//                           with nonce_for(nonce, block index) and followed by its
//                           16-byte tag; an empty payload is one empty block
// Every block's associated data is "kvstream redis v1", the value's Redis key (which
// names namespace, context, chunk and level) and the payload's size, so a value or a
// block copied to another key, blocks swapped, and a value cut or extended at a block
// boundary all fail authentication. The block tags take the place of the clear
// value's xxh3 sums: no ":blocks" key is kept (sums of the plaintext would let one
// test guesses of it), and a range read opens only the blocks it crosses.
//
// Not sealed: key names, the size and parts tables (sizes, part offsets and scores),
// the context and chunk sets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kvstream/security.hpp"
#include "kvstream/status.hpp"
#include "security/key_ring.hpp"

namespace kvstream::redis::detail {

class Sealer {
 public:
  static constexpr size_t kHeaderBytes = 8 + 4 + 12;
  static constexpr size_t kTagBytes = 16;

  /// From the key file `s` names; null when it names none (values in clear).
  /// `read_clear`: whether values stored in clear are still delivered. Errors: those
  /// of KeyRing::load.
  static Result<std::shared_ptr<const Sealer>> create(const AtRestSettings& s, std::string name_space,
                                                      bool read_clear);
  /// From a key ring in memory (tests).
  static std::shared_ptr<const Sealer> with_ring(std::shared_ptr<const security::KeyRing> ring,
                                                 std::string name_space, bool read_clear);

  /// Whether a stored value that begins with `head` is sealed.
  static bool is_sealed(std::string_view head);
  /// Where block `i` begins in a sealed value.
  static uint64_t block_offset(uint64_t i);
  /// The payload size of a sealed value of `stored` bytes. Errors: corrupt_data
  /// (no payload size gives that length).
  static Result<uint64_t> payload_size(uint64_t stored);

  /// The sealed value of `payload` stored under `key`. Errors: internal.
  Result<std::string> seal(const std::string& key, std::span<const std::byte> payload) const;
  /// Opens the whole sealed `value` of `key` in place; the payload is a prefix of
  /// what follows the header. Errors: corrupt_data (length, authentication),
  /// permission_denied (a key id the key file does not hold).
  Result<std::span<const std::byte>> open(const std::string& key, std::span<std::byte> value) const;
  /// Opens blocks [first, first + n) of a sealed value of `key` with payload `size`
  /// and header `header`, given as `blocks` (what lies from block_offset(first) up
  /// to the end of the last), in place. Returns their payload, contiguous, at the
  /// start of `blocks`. Errors: as open.
  Result<std::span<const std::byte>> open_blocks(const std::string& key, std::string_view header, uint64_t size,
                                                 uint64_t first, std::span<std::byte> blocks) const;

  [[nodiscard]] bool read_clear() const { return read_clear_; }
  [[nodiscard]] uint32_t current_id() const { return ring_->current_id(); }

 private:
  Sealer(std::shared_ptr<const security::KeyRing> ring, std::string ns, bool read_clear)
      : ring_(std::move(ring)), ns_(std::move(ns)), read_clear_(read_clear) {}
  std::shared_ptr<const security::KeyRing> ring_;
  std::string ns_;
  bool read_clear_;
};

}  // namespace kvstream::redis::detail

// AES-256-GCM (OpenSSL EVP) for sealing stored bytes: one call per message, with a
// 96-bit nonce the caller makes unique per key and associated data that binds the
// bytes to where they belong.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvstream/status.hpp"
#include "security/key_ring.hpp"

namespace kvstream::security {

inline constexpr size_t kNonceBytes = 12;
inline constexpr size_t kTagBytes = 16;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Tag = std::array<uint8_t, kTagBytes>;

/// A fresh random nonce (RAND_bytes). Errors: internal (no entropy).
Result<Nonce> random_nonce();
/// `base` with its last 8 bytes XORed with `index` (little-endian): the nonces of one
/// object's blocks, unique as long as `base` is fresh per object.
Nonce nonce_for(const Nonce& base, uint64_t index);

/// Encrypts `plain` into `out` (same size; may be the same memory) and returns the
/// tag. Errors: invalid_argument (out shorter than plain), internal (OpenSSL failed).
Result<Tag> seal(const Key256& key, const Nonce& nonce, std::span<const std::byte> ad,
                 std::span<const std::byte> plain, std::span<std::byte> out);
/// Decrypts `cipher` into `out` (same size; may be the same memory) if `tag`
/// authenticates it with `ad`. Errors: corrupt_data (the tag does not match: wrong
/// key, wrong associated data, or bytes changed; `out` then holds nothing usable),
/// invalid_argument, internal.
Status open(const Key256& key, const Nonce& nonce, std::span<const std::byte> ad, std::span<const std::byte> cipher,
            const Tag& tag, std::span<std::byte> out);

}  // namespace kvstream::security

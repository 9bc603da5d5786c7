// Wire framing of the tcp backend (see docs/wire-tcp.md).
//
// Each message on the byte stream is
//
//   offset 0   u32 magic        kTcpMagic ("KVS1" as bytes), little-endian
//   offset 4   u32 header_len   0..kMaxHeaderBytes
//   offset 8   u64 body_len     0..kTcpMaxBodyBytes
//   offset 16  header_len bytes of header
//   then       body_len bytes of body
//
// All integers are little-endian. There is no padding and no trailer: TCP already
// checksums and orders the bytes, and the chunk protocol above checksums payloads.
// A receiver checks every prefix field before it trusts it: a bad magic or an
// out-of-bound length is corrupt_data and closes the connection, so a malformed or
// hostile peer can never make it allocate or read more than the bounds above.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvstream/transport.hpp"

namespace kvstream::transport::tcp {

inline constexpr uint32_t kTcpMagic = 0x3153564Bu;           ///< bytes 'K' 'V' 'S' '1'
inline constexpr size_t kTcpPrefixBytes = 16;                 ///< magic + header_len + body_len
inline constexpr uint64_t kTcpMaxBodyBytes = uint64_t(1) << 30;  ///< 1 GiB: Capabilities::max_message_bytes

/// The fixed prefix of one message, as decoded (not yet validated).
struct TcpPrefix {
  uint32_t magic = 0;
  uint32_t header_len = 0;
  uint64_t body_len = 0;
};

inline void store_le32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte(v >> (8 * i));
}
inline void store_le64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = std::byte(v >> (8 * i));
}
inline uint32_t load_le32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
inline uint64_t load_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

/// Writes the kTcpPrefixBytes prefix of a message to `out`.
inline void encode_prefix(std::byte* out, uint32_t header_len, uint64_t body_len, uint32_t magic = kTcpMagic) {
  store_le32(out, magic);
  store_le32(out + 4, header_len);
  store_le64(out + 8, body_len);
}

/// Reads the kTcpPrefixBytes prefix at `in`.
inline TcpPrefix decode_prefix(const std::byte* in) {
  return TcpPrefix{load_le32(in), load_le32(in + 4), load_le64(in + 8)};
}

}  // namespace kvstream::transport::tcp

// The TLS 1.3 record layer (RFC 8446 section 5) in user space, for one direction of
// a connection whose handshake OpenSSL did: what the kernel does under kTLS, so the
// two paths put the same bytes on the wire.
//
// A record is a 5-byte header (type 23, version 0x0303, length), then AES-GCM of
// (data, inner content type, no padding) with nonce = IV XOR the record's sequence
// number and the header as associated data. Only application data is carried; a
// peer's alert ends the stream and any other record type is refused.
#pragma once

#include <openssl/evp.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvstream/status.hpp"
#include "security/tls_keys.hpp"

namespace kvstream::security {

inline constexpr size_t kTlsRecordHeaderBytes = 5;
inline constexpr size_t kTlsMaxPlaintext = 16384;  ///< 2^14: data per record
/// Header, data, inner type and tag of a full record.
inline constexpr size_t kTlsMaxRecordBytes = kTlsRecordHeaderBytes + kTlsMaxPlaintext + 1 + 16;
/// Records one key may protect: AES-GCM's limit in TLS 1.3 (RFC 8446 section 5.5) is
/// 2^24.5 full records; past 2^24 the connection ends (no KeyUpdate here) and the
/// caller reconnects.
inline constexpr uint64_t kTlsMaxRecordsPerKey = uint64_t(1) << 24;

/// Bytes on the wire for `n` bytes of data.
constexpr size_t sealed_bytes(size_t n) {
  const size_t records = n == 0 ? 1 : (n + kTlsMaxPlaintext - 1) / kTlsMaxPlaintext;
  return n + records * (kTlsRecordHeaderBytes + 1 + 16);
}

/// Protects outgoing data.
class RecordSealer {
 public:
  RecordSealer() = default;
  RecordSealer(const RecordSealer&) = delete;
  RecordSealer& operator=(const RecordSealer&) = delete;
  ~RecordSealer();
  /// Errors: internal.
  Status init(const TrafficKey& key);
  /// Writes the records carrying `data` (at most 2^14 bytes each) to the start of
  /// `out`, which has room for sealed_bytes(data.size()), and returns how many bytes
  /// they took. Errors: invalid_argument (no room), resource_exhausted (the key's
  /// record limit), internal.
  Result<size_t> seal(std::span<const std::byte> data, std::span<std::byte> out);

 private:
  EVP_CIPHER_CTX* ctx_ = nullptr;
  TrafficKey key_;
  uint64_t seq_ = 0;
};

/// Opens incoming records.
class RecordOpener {
 public:
  RecordOpener() = default;
  RecordOpener(const RecordOpener&) = delete;
  RecordOpener& operator=(const RecordOpener&) = delete;
  ~RecordOpener();
  /// Errors: internal.
  Status init(const TrafficKey& key);
  /// Bytes of the record that starts `in` once its header is there (0 when fewer than
  /// 5 bytes are). Errors: corrupt_data (not an application-data record header of
  /// TLS 1.3, or a length over the bound).
  Result<size_t> record_bytes(std::span<const std::byte> in) const;
  /// Decrypts one whole record (`record`, record_bytes() long) into `out` (at least
  /// record.size() - 21 bytes) and returns the data's length. Errors: corrupt_data
  /// (authentication failed: a changed byte, a replayed, dropped or reordered
  /// record), unavailable (the peer's alert: it closed), unsupported (a handshake
  /// message such as KeyUpdate), resource_exhausted (the key's record limit).
  Result<size_t> open(std::span<const std::byte> record, std::span<std::byte> out);

 private:
  EVP_CIPHER_CTX* ctx_ = nullptr;
  TrafficKey key_;
  uint64_t seq_ = 0;
};

}  // namespace kvstream::security

#include "security/tls_record.hpp"

#include <openssl/crypto.h>

#include <cstring>

#include "core/log.hpp"

namespace kvstream::security {
namespace {

constexpr uint8_t kApplicationData = 23, kAlert = 21, kHandshake = 22;

std::array<uint8_t, 12> nonce_of(const TrafficKey& k, uint64_t seq) {
  std::array<uint8_t, 12> n = k.iv;
  for (int i = 0; i < 8; ++i) n[11 - i] ^= uint8_t(seq >> (8 * i));
  return n;
}

const EVP_CIPHER* cipher_of(const TrafficKey& k) { return k.key_bytes == 32 ? EVP_aes_256_gcm() : EVP_aes_128_gcm(); }

unsigned char* u8(std::byte* p) { return reinterpret_cast<unsigned char*>(p); }
const unsigned char* u8(const std::byte* p) { return reinterpret_cast<const unsigned char*>(p); }

Status init_ctx(EVP_CIPHER_CTX*& ctx, const TrafficKey& key, bool encrypt) {
  if (key.key_bytes != 16 && key.key_bytes != 32)
    return make_status(StatusCode::internal, "tls record layer: a key of {} bytes", key.key_bytes);
  if (!ctx) ctx = EVP_CIPHER_CTX_new();
  // The key schedule is set once; each record sets only its nonce.
  const int ok = ctx ? (encrypt ? EVP_EncryptInit_ex(ctx, cipher_of(key), nullptr, key.key.data(), nullptr)
                                : EVP_DecryptInit_ex(ctx, cipher_of(key), nullptr, key.key.data(), nullptr))
                     : 0;
  if (ok != 1) return make_status(StatusCode::internal, "tls record layer: cipher set-up failed");
  return {};
}

}  // namespace

RecordSealer::~RecordSealer() {
  EVP_CIPHER_CTX_free(ctx_);
  OPENSSL_cleanse(key_.key.data(), key_.key.size());
}

Status RecordSealer::init(const TrafficKey& key) {
  key_ = key;
  seq_ = 0;
  return init_ctx(ctx_, key_, true);
}

Result<size_t> RecordSealer::seal(std::span<const std::byte> data, std::span<std::byte> out) {
  if (out.size() < sealed_bytes(data.size()))
    return make_status(StatusCode::invalid_argument, "tls record layer: {} bytes of room for {} of data", out.size(),
                       data.size());
  size_t at = 0;
  size_t off = 0;
  do {
    if (seq_ >= kTlsMaxRecordsPerKey)
      return make_status(StatusCode::resource_exhausted,
                         "tls: this connection's key protected 2^24 records, its limit; reconnect");
    const size_t n = std::min(data.size() - off, kTlsMaxPlaintext);
    const size_t len = n + 1 + 16;
    std::byte* h = out.data() + at;
    h[0] = std::byte(kApplicationData), h[1] = std::byte(3), h[2] = std::byte(3);
    h[3] = std::byte(len >> 8), h[4] = std::byte(len & 0xff);
    const auto nonce = nonce_of(key_, seq_++);
    int w = 0;
    const std::byte type{kApplicationData};
    std::byte* body = h + kTlsRecordHeaderBytes;
    const bool ok = EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce.data()) == 1 &&
                    EVP_EncryptUpdate(ctx_, nullptr, &w, u8(h), int(kTlsRecordHeaderBytes)) == 1 &&
                    (n == 0 || EVP_EncryptUpdate(ctx_, u8(body), &w, u8(data.data() + off), int(n)) == 1) &&
                    EVP_EncryptUpdate(ctx_, u8(body + n), &w, u8(&type), 1) == 1 &&
                    EVP_EncryptFinal_ex(ctx_, nullptr, &w) == 1 &&
                    EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, 16, u8(body + n + 1)) == 1;
    if (!ok) return make_status(StatusCode::internal, "tls: record encryption failed");
    at += kTlsRecordHeaderBytes + len;
    off += n;
  } while (off < data.size());
  return at;
}

RecordOpener::~RecordOpener() {
  EVP_CIPHER_CTX_free(ctx_);
  OPENSSL_cleanse(key_.key.data(), key_.key.size());
}

Status RecordOpener::init(const TrafficKey& key) {
  key_ = key;
  seq_ = 0;
  return init_ctx(ctx_, key_, false);
}

// The errors a peer causes with what it sends are not logged here: the connection that
// reads the records logs them as its side calls for (a node's accepted connections at
// debug, their owner rate-limits; tcp_connection.hpp, peer_fault).
Result<size_t> RecordOpener::record_bytes(std::span<const std::byte> in) const {
  if (in.size() < kTlsRecordHeaderBytes) return size_t(0);
  const auto type = uint8_t(in[0]);
  const size_t len = size_t(uint8_t(in[3])) << 8 | size_t(uint8_t(in[4]));
  // In TLS 1.3 every protected record says application data on the outside.
  if (type != kApplicationData || in[1] != std::byte(3) || in[2] != std::byte(3))
    return detail::unlogged_status(StatusCode::corrupt_data, "not a TLS 1.3 record (type {}, version {:#04x}{:02x})",
                                   type, uint8_t(in[1]), uint8_t(in[2]));
  if (len < 17 || len > kTlsMaxPlaintext + 256)
    return detail::unlogged_status(StatusCode::corrupt_data, "a TLS record of {} bytes is outside its bounds", len);
  return kTlsRecordHeaderBytes + len;
}

Result<size_t> RecordOpener::open(std::span<const std::byte> record, std::span<std::byte> out) {
  KVS_ASSIGN_OR_RETURN(const size_t whole, record_bytes(record));
  if (whole == 0 || whole != record.size())
    return make_status(StatusCode::internal, "tls record layer: open() of a partial record");
  const size_t inner = whole - kTlsRecordHeaderBytes - 16;
  if (out.size() < inner) return make_status(StatusCode::internal, "tls record layer: output too small");
  if (seq_ >= kTlsMaxRecordsPerKey)
    return detail::unlogged_status(StatusCode::resource_exhausted,
                                   "tls: the peer's key protected 2^24 records, its limit");
  const auto nonce = nonce_of(key_, seq_++);
  const std::byte* body = record.data() + kTlsRecordHeaderBytes;
  std::array<uint8_t, 16> tag;
  std::memcpy(tag.data(), body + inner, 16);
  int w = 0;
  const bool started = EVP_DecryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce.data()) == 1 &&
                       EVP_DecryptUpdate(ctx_, nullptr, &w, u8(record.data()), int(kTlsRecordHeaderBytes)) == 1 &&
                       EVP_DecryptUpdate(ctx_, u8(out.data()), &w, u8(body), int(inner)) == 1 &&
                       EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, 16, tag.data()) == 1;
  if (!started) return make_status(StatusCode::internal, "tls: record decryption failed to start");
  if (EVP_DecryptFinal_ex(ctx_, nullptr, &w) != 1)
    return detail::unlogged_status(StatusCode::corrupt_data,
                                   "a TLS record failed authentication (bad_record_mac: changed, replayed or "
                                   "reordered)");
  // The inner plaintext ends with its content type, then zero padding.
  size_t end = inner;
  while (end > 0 && out[end - 1] == std::byte(0)) --end;
  if (end == 0) return detail::unlogged_status(StatusCode::corrupt_data, "a TLS record without a content type");
  const auto type = uint8_t(out[end - 1]);
  if (type == kAlert) {
    // (level, description): what the peer says when it closes. After the handshake a
    // server still refuses a client's certificate this way (TLS 1.3 lets the client
    // finish first).
    const int description = end >= 3 ? int(uint8_t(out[end - 2])) : -1;
    if (description == 0)
      return detail::unlogged_status(StatusCode::unavailable, "the peer closed its TLS stream (close_notify)");
    const bool certificate = (description >= 42 && description <= 49) || description == 116;
    return detail::unlogged_status(certificate ? StatusCode::permission_denied : StatusCode::unavailable,
                                   "the peer ended the TLS stream with alert {}{}", description,
                                   certificate ? " (it refused this side's certificate, or its absence)" : "");
  }
  if (type == kHandshake)
    return detail::unlogged_status(StatusCode::unsupported,
                                   "the peer sent a TLS handshake message after the handshake (KeyUpdate or a "
                                   "ticket), which kvstream does not take");
  if (type != kApplicationData)
    return detail::unlogged_status(StatusCode::corrupt_data, "a TLS record of inner type {}", type);
  return end - 1;
}

}  // namespace kvstream::security

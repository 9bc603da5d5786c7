// The TLS 1.3 traffic keys of an established session, for a record layer that runs
// outside OpenSSL: the kernel's (kTLS) or tls_record.hpp's.
//
// OpenSSL hands a session's traffic secrets only to a key-log callback, so every
// context made by TlsContext installs one that keeps them with the session (never
// writes them anywhere); the keys and IVs are then derived as RFC 8446 section 7.3
// says. Sending and receiving each get their own key, so each direction of a
// connection runs on its own thread without sharing the SSL object (which OpenSSL
// does not allow).
#pragma once

#include <openssl/ssl.h>

#include <array>
#include <cstdint>

#include "kvstream/status.hpp"

namespace kvstream::security {

/// One direction's record protection: AES-GCM with a 16- or 32-byte key.
struct TrafficKey {
  std::array<uint8_t, 32> key{};
  size_t key_bytes = 0;  ///< 16 (TLS_AES_128_GCM_SHA256) or 32 (TLS_AES_256_GCM_SHA384)
  std::array<uint8_t, 12> iv{};
};

struct TrafficKeys {
  TrafficKey send, receive;
};

/// Makes contexts keep each session's traffic secrets (called by TlsContext).
void capture_traffic_secrets(SSL_CTX* ctx);

/// The application traffic keys of `ssl`, whose handshake has completed, for this
/// side (`is_server`). The secrets are wiped from the session afterwards. Errors:
/// unsupported (a cipher suite other than AES-GCM), internal (no secrets captured,
/// HKDF failed).
Result<TrafficKeys> take_traffic_keys(SSL* ssl, bool is_server);

}  // namespace kvstream::security

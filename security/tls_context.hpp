// TLS 1.3 through OpenSSL: a context built from TlsSettings (certificates, trust,
// AES-GCM suites only), the handshake on a socket under a deadline, and the names a
// verified peer certificate carries. The tcp backend and the Redis client use it;
// each drives the record layer its own way once the handshake is done (the tcp
// backend outside OpenSSL: tls_keys.hpp, tls_record.hpp).
#pragma once

#include <openssl/ssl.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvstream/security.hpp"
#include "kvstream/status.hpp"
#include "security/tls_keys.hpp"

namespace kvstream::security {

enum class TlsRole { client, server };

struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};
using SslPtr = std::unique_ptr<SSL, SslFree>;

/// An SSL_CTX for one role, TLS 1.3 only, no session tickets (nothing arrives after
/// the handshake that the kernel's record layer could not take).
class TlsContext {
 public:
  /// Loads the certificate, key and trust `s` names. Errors: invalid_argument
  /// (TLS not enabled, a server without certificate or key, a key that does not
  /// match its certificate, an unreadable or malformed file), internal.
  static Result<std::shared_ptr<const TlsContext>> create(const TlsSettings& s, TlsRole role);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  /// A session for one connection. Client: `host` (or settings().server_name) is
  /// sent as SNI and is what the server's certificate must name (DNS or IP).
  Result<SslPtr> new_session(std::string_view host) const;

  [[nodiscard]] const TlsSettings& settings() const { return settings_; }
  [[nodiscard]] TlsRole role() const { return role_; }

 private:
  TlsContext(const TlsSettings& s, TlsRole role) : settings_(s), role_(role) {}
  TlsSettings settings_;
  TlsRole role_;
  SSL_CTX* ctx_ = nullptr;
};

/// One step of a non-blocking handshake: done, waiting for the socket to be readable
/// or writable, or failed (`error`: permission_denied when a certificate was refused
/// by either side, unavailable when the peer closed, corrupt_data when it does not
/// speak TLS 1.3, io_error; the message names `peer` and OpenSSL's reason).
struct HandshakeStep {
  bool done = false;
  short wait_events = 0;  ///< POLLIN or POLLOUT while neither done nor failed
  Status error;
};
HandshakeStep step_handshake(SSL* ssl, std::string_view peer);

/// Runs the handshake of `ssl` (its fd already set) on a connected socket to its end,
/// making the socket non-blocking for the duration and blocking again after, waiting
/// with poll() in slices so `cancelled` is seen promptly. Errors: step_handshake's,
/// timed_out, cancelled.
Status run_handshake(SSL* ssl, int fd, std::chrono::steady_clock::time_point deadline,
                     const std::function<bool()>& cancelled, std::string_view peer);

/// What a completed handshake leaves for a record layer outside OpenSSL.
struct TlsEstablished {
  TrafficKeys keys;
  std::vector<std::string> peer_names;  ///< verified_peer_names()
  std::string suite;                    ///< e.g. "TLS_AES_256_GCM_SHA384"
};
/// Takes the traffic keys and the peer's names from `ssl`, whose handshake is done
/// (the SSL object is of no further use: it must not send anything). Errors: those
/// of take_traffic_keys.
Result<TlsEstablished> finish_handshake(SSL* ssl, TlsRole role);

/// Subject CN, DNS and URI names of the peer's certificate when it was verified;
/// empty when there is none.
std::vector<std::string> verified_peer_names(const SSL* ssl);

/// OpenSSL's error queue as one line (emptied), for messages.
std::string openssl_errors();

}  // namespace kvstream::security

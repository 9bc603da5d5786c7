#include "security/tls_context.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.hpp"
#include "security/tls_keys.hpp"

namespace kvstream::security {
namespace {

bool is_ip_literal(const std::string& host) {
  unsigned char buf[16];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

Status file_error(std::string_view what, const std::string& path) {
  return make_status(StatusCode::invalid_argument, "tls: cannot use {} '{}': {}", what, path, openssl_errors());
}

}  // namespace

std::string openssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no OpenSSL error recorded" : out;
}

Result<std::shared_ptr<const TlsContext>> TlsContext::create(const TlsSettings& s, TlsRole role) {
  if (!s.enabled) return make_status(StatusCode::invalid_argument, "tls: a context was asked for with TLS off");
  if (role == TlsRole::server && (s.cert_file.empty() || s.key_file.empty()))
    return make_status(StatusCode::invalid_argument, "tls: a server needs a certificate and a key (cert_file, key_file)");
  if (s.cert_file.empty() != s.key_file.empty())
    return make_status(StatusCode::invalid_argument, "tls: cert_file and key_file go together");
  ERR_clear_error();
  std::shared_ptr<TlsContext> c(new TlsContext(s, role));
  c->ctx_ = SSL_CTX_new(role == TlsRole::server ? TLS_server_method() : TLS_client_method());
  if (!c->ctx_) return make_status(StatusCode::internal, "tls: SSL_CTX_new: {}", openssl_errors());
  SSL_CTX* ctx = c->ctx_;
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  // No tickets: a NewSessionTicket after the handshake would be a record the kernel's
  // receive path rejects (and resumption saves nothing on long-lived connections).
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
  // AES-GCM only: the suites the kernel's record layer and tls_record.hpp both take.
  if (SSL_CTX_set_ciphersuites(ctx, "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256") != 1)
    return make_status(StatusCode::internal, "tls: cipher suites: {}", openssl_errors());
  // The record layer runs outside OpenSSL after the handshake (kernel or
  // tls_record.hpp), each direction on its own key: OpenSSL's own kTLS stays off.
  capture_traffic_secrets(ctx);
  if (!s.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, s.cert_file.c_str()) != 1) return file_error("certificate", s.cert_file);
    if (SSL_CTX_use_PrivateKey_file(ctx, s.key_file.c_str(), SSL_FILETYPE_PEM) != 1)
      return file_error("private key", s.key_file);
    if (SSL_CTX_check_private_key(ctx) != 1)
      return make_status(StatusCode::invalid_argument, "tls: key '{}' does not match certificate '{}'", s.key_file,
                         s.cert_file);
  }
  if (role == TlsRole::client) {
    if (!s.ca_file.empty()) {
      if (SSL_CTX_load_verify_locations(ctx, s.ca_file.c_str(), nullptr) != 1) return file_error("CA file", s.ca_file);
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
      return make_status(StatusCode::internal, "tls: no system trust store: {}", openssl_errors());
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  } else if (!s.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, s.ca_file.c_str(), nullptr) != 1) return file_error("CA file", s.ca_file);
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(s.ca_file.c_str())) SSL_CTX_set_client_CA_list(ctx, names);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | (s.require_client_cert ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0), nullptr);
  } else if (s.require_client_cert) {
    return make_status(StatusCode::invalid_argument,
                       "tls: require_client_cert needs ca_file (the authorities client certificates are checked "
                       "against)");
  }
  return std::shared_ptr<const TlsContext>(std::move(c));
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

Result<SslPtr> TlsContext::new_session(std::string_view host) const {
  SslPtr ssl(SSL_new(ctx_));
  if (!ssl) return make_status(StatusCode::internal, "tls: SSL_new: {}", openssl_errors());
  if (role_ == TlsRole::client) {
    const std::string name = settings_.server_name.empty() ? std::string(host) : settings_.server_name;
    if (name.empty()) return make_status(StatusCode::invalid_argument, "tls: no server name to verify");
    if (is_ip_literal(name)) {
      if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), name.c_str()) != 1)
        return make_status(StatusCode::invalid_argument, "tls: cannot verify against address '{}'", name);
    } else {
      SSL_set_tlsext_host_name(ssl.get(), name.c_str());
      if (SSL_set1_host(ssl.get(), name.c_str()) != 1)
        return make_status(StatusCode::invalid_argument, "tls: cannot verify against name '{}'", name);
    }
    SSL_set_connect_state(ssl.get());
  } else {
    SSL_set_accept_state(ssl.get());
  }
  return ssl;
}

// Not logged here: a peer causes these at will; run_handshake (the client) logs its
// own, the tcp listener counts and rate-limits the ones its peers cause.
HandshakeStep step_handshake(SSL* ssl, std::string_view peer) {
  HandshakeStep out;
  ERR_clear_error();
  errno = 0;
  const int rc = SSL_do_handshake(ssl);
  if (rc == 1) {
    out.done = true;
    return out;
  }
  const int err = SSL_get_error(ssl, rc);
  if (err == SSL_ERROR_WANT_READ) {
    out.wait_events = POLLIN;
    return out;
  }
  if (err == SSL_ERROR_WANT_WRITE) {
    out.wait_events = POLLOUT;
    return out;
  }
  const long verify = SSL_get_verify_result(ssl);
  const unsigned long first = ERR_peek_error();
  const int sys_errno = errno;
  if (verify != X509_V_OK) {
    out.error = detail::unlogged_status(StatusCode::permission_denied, "tls handshake with {}: certificate refused: {}",
                                        peer, X509_verify_cert_error_string(verify));
  } else if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && first == 0) ||
             ERR_GET_REASON(first) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
    ERR_clear_error();
    out.error = detail::unlogged_status(StatusCode::unavailable,
                                        "tls handshake with {}: the peer closed the connection{}", peer,
                                        sys_errno != 0 ? fmt::format(" ({})", std::strerror(sys_errno)) : "");
  } else {
    const std::string why = openssl_errors();
    // Alerts the peer sent about our certificate, or its absence.
    const bool refused = why.find("certificate") != std::string::npos || why.find("alert") != std::string::npos;
    out.error = detail::unlogged_status(refused ? StatusCode::permission_denied : StatusCode::corrupt_data,
                                        "tls handshake with {} failed: {}", peer, why);
  }
  return out;
}

Status run_handshake(SSL* ssl, int fd, std::chrono::steady_clock::time_point deadline,
                     const std::function<bool()>& cancelled, std::string_view peer) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return make_status(StatusCode::io_error, "tls handshake with {}: fcntl: {}", peer, std::strerror(errno));
  struct Restore {
    int fd, flags;
    ~Restore() { fcntl(fd, F_SETFL, flags); }
  } restore{fd, flags};
  for (;;) {
    const HandshakeStep step = step_handshake(ssl, peer);
    if (step.done) return {};
    if (!step.error.ok()) {
      detail::log_new_error(step.error);
      return step.error;
    }
    for (;;) {
      if (cancelled && cancelled()) return make_status(StatusCode::cancelled, "tls handshake with {}: cancelled", peer);
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero())
        return make_status(StatusCode::timed_out, "tls handshake with {}: deadline passed", peer);
      const int ms = int(std::clamp<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1, 1, 50));
      pollfd p{fd, step.wait_events, 0};
      const int n = poll(&p, 1, ms);
      if (n < 0 && errno != EINTR)
        return make_status(StatusCode::io_error, "tls handshake with {}: poll: {}", peer, std::strerror(errno));
      if (n > 0) break;
    }
  }
}

Result<TlsEstablished> finish_handshake(SSL* ssl, TlsRole role) {
  TlsEstablished e;
  e.peer_names = verified_peer_names(ssl);
  const SSL_CIPHER* c = SSL_get_current_cipher(ssl);
  e.suite = c ? SSL_CIPHER_get_name(c) : "?";
  KVS_ASSIGN_OR_RETURN(e.keys, take_traffic_keys(ssl, role == TlsRole::server));
  return e;
}

std::vector<std::string> verified_peer_names(const SSL* ssl) {
  std::vector<std::string> names;
  if (SSL_get_verify_result(ssl) != X509_V_OK) return names;
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (!cert) return names;
  if (X509_NAME* subject = X509_get_subject_name(cert)) {
    const int i = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
    if (i >= 0) {
      ASN1_STRING* s = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, i));
      names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)), size_t(ASN1_STRING_length(s)));
    }
  }
  auto* sans = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans); ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(sans, i);
    if (g->type != GEN_DNS && g->type != GEN_URI) continue;
    const ASN1_STRING* s = g->type == GEN_DNS ? g->d.dNSName : g->d.uniformResourceIdentifier;
    names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)), size_t(ASN1_STRING_length(s)));
  }
  GENERAL_NAMES_free(sans);
  // A name with an embedded NUL could pose as a shorter one: drop it.
  std::erase_if(names, [](const std::string& n) { return n.empty() || n.find('\0') != std::string::npos; });
  return names;
}

}  // namespace kvstream::security

#include "security/tls_keys.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>

#include <array>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace kvstream::security {
namespace {

// The two application secrets, kept with their session until taken.
struct Secrets {
  std::vector<uint8_t> client, server;
  ~Secrets() {
    OPENSSL_cleanse(client.data(), client.size());
    OPENSSL_cleanse(server.data(), server.size());
  }
};

int secrets_index() {
  static const int index = SSL_get_ex_new_index(
      0, nullptr, nullptr, nullptr, [](void*, void* p, CRYPTO_EX_DATA*, int, long, void*) {
        delete static_cast<Secrets*>(p);
      });
  return index;
}

bool from_hex(std::string_view hex, std::vector<uint8_t>& out) {
  if (hex.size() % 2) return false;
  out.resize(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    unsigned v = 0;
    for (int k = 0; k < 2; ++k) {
      const char c = hex[2 * i + k];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') v |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= unsigned(c - 'A' + 10);
      else return false;
    }
    out[i] = uint8_t(v);
  }
  return true;
}

// The key-log line "LABEL <client random> <secret>": only the application secrets
// are kept.
void on_keylog(const SSL* ssl, const char* line) {
  const std::string_view l(line);
  const bool client = l.starts_with("CLIENT_TRAFFIC_SECRET_0 "), server = l.starts_with("SERVER_TRAFFIC_SECRET_0 ");
  if (!client && !server) return;
  const size_t last = l.rfind(' ');
  auto* s = static_cast<Secrets*>(SSL_get_ex_data(ssl, secrets_index()));
  if (!s) {
    s = new Secrets;
    if (SSL_set_ex_data(const_cast<SSL*>(ssl), secrets_index(), s) != 1) {
      delete s;
      return;
    }
  }
  (void)from_hex(l.substr(last + 1), client ? s->client : s->server);
}

// HKDF-Expand-Label(secret, label, "", length) of RFC 8446 section 7.1.
bool expand_label(const EVP_MD* md, const std::vector<uint8_t>& secret, std::string_view label, uint8_t* out,
                  size_t length) {
  // struct { uint16 length; opaque label<7..255> = "tls13 " + label; opaque context<0..255> = ""; }
  std::array<uint8_t, 64> info{};
  size_t n = 0;
  info[n++] = uint8_t(length >> 8);
  info[n++] = uint8_t(length);
  info[n++] = uint8_t(6 + label.size());
  std::memcpy(info.data() + n, "tls13 ", 6);
  n += 6;
  std::memcpy(info.data() + n, label.data(), label.size());
  n += label.size();
  info[n++] = 0;  // empty context
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  size_t len = length;
  const bool ok = ctx && EVP_PKEY_derive_init(ctx) > 0 &&
                  EVP_PKEY_CTX_set_hkdf_mode(ctx, EVP_PKEY_HKDEF_MODE_EXPAND_ONLY) > 0 &&
                  EVP_PKEY_CTX_set_hkdf_md(ctx, md) > 0 &&
                  EVP_PKEY_CTX_set1_hkdf_key(ctx, secret.data(), int(secret.size())) > 0 &&
                  EVP_PKEY_CTX_add1_hkdf_info(ctx, info.data(), int(n)) > 0 &&
                  EVP_PKEY_derive(ctx, out, &len) > 0 && len == length;
  EVP_PKEY_CTX_free(ctx);
  return ok;
}

}  // namespace

void capture_traffic_secrets(SSL_CTX* ctx) {
  (void)secrets_index();
  SSL_CTX_set_keylog_callback(ctx, on_keylog);
}

Result<TrafficKeys> take_traffic_keys(SSL* ssl, bool is_server) {
  auto* s = static_cast<Secrets*>(SSL_get_ex_data(ssl, secrets_index()));
  if (!s || s->client.empty() || s->server.empty())
    return make_status(StatusCode::internal, "tls: the session's traffic secrets were not captured");
  const SSL_CIPHER* cipher = SSL_get_current_cipher(ssl);
  const std::string_view name = cipher ? SSL_CIPHER_get_name(cipher) : "";
  const EVP_MD* md = nullptr;
  size_t key_bytes = 0;
  if (name == "TLS_AES_256_GCM_SHA384") md = EVP_sha384(), key_bytes = 32;
  else if (name == "TLS_AES_128_GCM_SHA256") md = EVP_sha256(), key_bytes = 16;
  else return make_status(StatusCode::unsupported, "tls: cipher suite '{}' is not AES-GCM", name);
  TrafficKeys keys;
  TrafficKey& client = is_server ? keys.receive : keys.send;
  TrafficKey& server = is_server ? keys.send : keys.receive;
  client.key_bytes = server.key_bytes = key_bytes;
  const bool ok = expand_label(md, s->client, "key", client.key.data(), key_bytes) &&
                  expand_label(md, s->client, "iv", client.iv.data(), 12) &&
                  expand_label(md, s->server, "key", server.key.data(), key_bytes) &&
                  expand_label(md, s->server, "iv", server.iv.data(), 12);
  SSL_set_ex_data(ssl, secrets_index(), nullptr);
  delete s;
  if (!ok) return make_status(StatusCode::internal, "tls: HKDF-Expand-Label of the traffic keys failed");
  return keys;
}

}  // namespace kvstream::security

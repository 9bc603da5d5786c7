// Certificates for TLS tests, made with OpenSSL's C API (no `openssl` program needed):
// a CA, a server certificate it signs for localhost and 127.0.0.1, a client
// certificate, and an unrelated CA with a client certificate of its own (what a
// peer that must be refused presents or trusts). P-256 keys, valid from an hour ago
// for ten days. Header-only; link OpenSSL::Crypto.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace kvstream::testing {

/// PEM files under one directory. `error` is empty when all were written.
struct TestCerts {
  std::string ca;                        ///< ca.pem: the CA both sides trust
  std::string server_cert, server_key;   ///< server.pem/.key: CN localhost, SAN DNS:localhost, IP:127.0.0.1
                                         ///< (serverAuth and clientAuth, so cluster peers can use it both ways)
  std::string client_cert, client_key;   ///< client.pem/.key: CN and SAN DNS `client_name`, signed by ca
  std::string other_ca;                  ///< other_ca.pem: an unrelated CA
  std::string other_client_cert, other_client_key;  ///< other_client.pem/.key: CN `client_name`, signed by other_ca
  std::string error;
  [[nodiscard]] bool ok() const { return error.empty(); }
};

namespace certs_detail {

struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertFree {
  void operator()(X509* x) const { X509_free(x); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;
using CertPtr = std::unique_ptr<X509, CertFree>;

inline KeyPtr new_key() { return KeyPtr(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256")); }

// Adds one extension in openssl.cnf syntax ("critical,CA:TRUE").
inline bool add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `key` named `cn`, signed by `issuer`/`issuer_key` (itself when
// null: a self-signed CA). `sans`: subjectAltName value, or "" for none.
inline CertPtr make_cert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key, bool ca,
                         const std::string& sans, const std::string& eku, long serial) {
  CertPtr x(X509_new());
  if (!x) return nullptr;
  X509_set_version(x.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x.get()), serial);
  X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x.get()), 10L * 24 * 3600);
  X509_set_pubkey(x.get(), key);
  X509_NAME* name = X509_get_subject_name(x.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* signer = issuer ? issuer : x.get();
  X509_set_issuer_name(x.get(), X509_get_subject_name(signer));
  bool ok = add_ext(x.get(), signer, NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE") &&
            add_ext(x.get(), signer, NID_key_usage,
                    ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature,keyEncipherment") &&
            add_ext(x.get(), signer, NID_subject_key_identifier, "hash") &&
            (ca || add_ext(x.get(), signer, NID_authority_key_identifier, "keyid:always"));
  if (ok && !sans.empty()) ok = add_ext(x.get(), signer, NID_subject_alt_name, sans);
  if (ok && !eku.empty()) ok = add_ext(x.get(), signer, NID_ext_key_usage, eku);
  if (!ok || X509_sign(x.get(), issuer_key ? issuer_key : key, EVP_sha256()) == 0) return nullptr;
  return x;
}

inline bool write_cert(const std::string& path, X509* x) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  const bool ok = PEM_write_X509(f, x) == 1;
  return std::fclose(f) == 0 && ok;
}

inline bool write_key(const std::string& path, EVP_PKEY* k) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  ::chmod(path.c_str(), 0600);  // as a real key file would be
  const bool ok = PEM_write_PrivateKey(f, k, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  return std::fclose(f) == 0 && ok;
}

}  // namespace certs_detail

/// Writes the files of TestCerts into `dir` (created if missing). `client_name`: the
/// client certificates' CN and DNS name (what a server maps to a tenant).
inline TestCerts make_test_certs(const std::string& dir, const std::string& client_name = "tenant-a") {
  using namespace certs_detail;
  TestCerts t;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const auto at = [&](const char* f) { return (std::filesystem::path(dir) / f).string(); };
  t.ca = at("ca.pem"), t.server_cert = at("server.pem"), t.server_key = at("server.key");
  t.client_cert = at("client.pem"), t.client_key = at("client.key"), t.other_ca = at("other_ca.pem");
  t.other_client_cert = at("other_client.pem"), t.other_client_key = at("other_client.key");

  KeyPtr ca_key = new_key(), server_key = new_key(), client_key = new_key(), other_key = new_key(),
         other_client_key = new_key();
  if (!ca_key || !server_key || !client_key || !other_key || !other_client_key) {
    t.error = "cannot generate P-256 keys";
    return t;
  }
  CertPtr ca = make_cert(ca_key.get(), "kvstream test CA", nullptr, nullptr, true, "", "", 1);
  CertPtr other = make_cert(other_key.get(), "kvstream unrelated test CA", nullptr, nullptr, true, "", "", 1);
  if (!ca || !other) {
    t.error = "cannot make the test CAs";
    return t;
  }
  CertPtr server = make_cert(server_key.get(), "localhost", ca.get(), ca_key.get(), false,
                             "DNS:localhost,IP:127.0.0.1", "serverAuth,clientAuth", 2);
  CertPtr client = make_cert(client_key.get(), client_name, ca.get(), ca_key.get(), false, "DNS:" + client_name,
                             "clientAuth", 3);
  CertPtr other_client = make_cert(other_client_key.get(), client_name, other.get(), other_key.get(), false,
                                   "DNS:" + client_name, "clientAuth", 2);
  if (!server || !client || !other_client) {
    t.error = "cannot sign the test certificates";
    return t;
  }
  const bool written = write_cert(t.ca, ca.get()) && write_cert(t.other_ca, other.get()) &&
                       write_cert(t.server_cert, server.get()) && write_key(t.server_key, server_key.get()) &&
                       write_cert(t.client_cert, client.get()) && write_key(t.client_key, client_key.get()) &&
                       write_cert(t.other_client_cert, other_client.get()) &&
                       write_key(t.other_client_key, other_client_key.get());
  if (!written) t.error = "cannot write the certificates under " + dir;
  return t;
}

}  // namespace kvstream::testing

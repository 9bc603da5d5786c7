#include "security/key_ring.hpp"

#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <sys/stat.h>

#include <cctype>
#include <fstream>
#include <sstream>

#include "core/log.hpp"

namespace kvstream::security {
namespace {

constexpr std::string_view kSalt = "kvstream at-rest v1";

bool parse_hex(std::string_view hex, Key256& out) {
  if (hex.size() != 64) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    c = char(std::tolower(static_cast<unsigned char>(c)));
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < 32; ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = uint8_t(hi << 4 | lo);
  }
  return true;
}

}  // namespace

Result<std::shared_ptr<const KeyRing>> KeyRing::load(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return make_status(StatusCode::not_found, "key file '{}' does not exist", path);
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    KVS_LOG_WARN("key file '{}' is readable by group or others (mode {:o}); it holds every tenant's master keys",
                 path, st.st_mode & 0777);
  std::ifstream f(path);
  if (!f) return make_status(StatusCode::io_error, "cannot read key file '{}'", path);
  std::map<uint32_t, Key256> keys;
  std::string line;
  for (int no = 1; std::getline(f, line); ++no) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream in(line);
    std::string id_text, hex, extra;
    if (!(in >> id_text)) continue;  // blank or comment
    in >> hex >> extra;
    uint64_t id = 0;
    bool id_ok = !id_text.empty() && id_text.size() <= 10;
    for (char c : id_text) id_ok = id_ok && std::isdigit(static_cast<unsigned char>(c));
    if (id_ok) id = std::stoull(id_text);
    Key256 key{};
    // The line's text is never echoed: it may be a key.
    if (!id_ok || id == 0 || id > UINT32_MAX || !extra.empty() || !parse_hex(hex, key))
      return make_status(StatusCode::invalid_argument,
                         "key file '{}' line {}: not \"<id 1..4294967295> <64 hex digits>\"", path, no);
    if (!keys.emplace(uint32_t(id), key).second)
      return make_status(StatusCode::invalid_argument, "key file '{}' line {}: key id {} appears twice", path, no, id);
  }
  if (keys.empty()) return make_status(StatusCode::invalid_argument, "key file '{}' holds no key", path);
  return from_keys(std::move(keys));
}

Result<std::shared_ptr<const KeyRing>> KeyRing::from_keys(std::map<uint32_t, Key256> keys) {
  if (keys.empty()) return make_status(StatusCode::invalid_argument, "a key ring needs at least one key");
  if (keys.count(0)) return make_status(StatusCode::invalid_argument, "key id 0 is reserved (objects in clear)");
  return std::shared_ptr<const KeyRing>(new KeyRing(std::move(keys)));
}

Result<Key256> KeyRing::tenant_key(uint32_t id, std::string_view ns) const {
  const auto master = keys_.find(id);
  if (master == keys_.end())
    return make_status(StatusCode::not_found, "the key file has no key {} (needed by an object sealed under it)", id);
  std::lock_guard lock(mu_);
  if (auto it = derived_.find(std::pair(id, std::string(ns))); it != derived_.end()) return it->second;
  Key256 out{};
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  const bool ok = ctx && EVP_PKEY_derive_init(ctx) > 0 && EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) > 0 &&
                  EVP_PKEY_CTX_set1_hkdf_salt(ctx, reinterpret_cast<const unsigned char*>(kSalt.data()),
                                              int(kSalt.size())) > 0 &&
                  EVP_PKEY_CTX_set1_hkdf_key(ctx, master->second.data(), int(master->second.size())) > 0 &&
                  EVP_PKEY_CTX_add1_hkdf_info(ctx, reinterpret_cast<const unsigned char*>(ns.data()),
                                              int(ns.size())) > 0;
  size_t len = out.size();
  const bool derived = ok && EVP_PKEY_derive(ctx, out.data(), &len) > 0 && len == out.size();
  EVP_PKEY_CTX_free(ctx);
  if (!derived) return make_status(StatusCode::internal, "HKDF-SHA256 of a tenant key failed");
  derived_.emplace(std::pair(id, std::string(ns)), out);
  return out;
}

}  // namespace kvstream::security

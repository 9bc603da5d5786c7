#include "security/aead.hpp"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <memory>

namespace kvstream::security {
namespace {

struct CtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using Ctx = std::unique_ptr<EVP_CIPHER_CTX, CtxFree>;

// One context per thread, reset per message: saves an allocation per block.
EVP_CIPHER_CTX* thread_ctx() {
  thread_local Ctx ctx(EVP_CIPHER_CTX_new());
  return ctx.get();
}

const unsigned char* u8(const void* p) { return static_cast<const unsigned char*>(p); }

}  // namespace

Result<Nonce> random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), int(n.size())) != 1) return make_status(StatusCode::internal, "RAND_bytes failed");
  return n;
}

Nonce nonce_for(const Nonce& base, uint64_t index) {
  Nonce n = base;
  for (int i = 0; i < 8; ++i) n[4 + i] ^= uint8_t(index >> (8 * i));
  return n;
}

Result<Tag> seal(const Key256& key, const Nonce& nonce, std::span<const std::byte> ad,
                 std::span<const std::byte> plain, std::span<std::byte> out) {
  if (out.size() < plain.size()) return make_status(StatusCode::invalid_argument, "seal: output shorter than input");
  EVP_CIPHER_CTX* c = thread_ctx();
  int len = 0;
  Tag tag{};
  const bool ok = c && EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), nullptr, key.data(), nonce.data()) == 1 &&
                  (ad.empty() || EVP_EncryptUpdate(c, nullptr, &len, u8(ad.data()), int(ad.size())) == 1) &&
                  (plain.empty() || EVP_EncryptUpdate(c, reinterpret_cast<unsigned char*>(out.data()), &len,
                                                      u8(plain.data()), int(plain.size())) == 1) &&
                  EVP_EncryptFinal_ex(c, nullptr, &len) == 1 &&
                  EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, int(tag.size()), tag.data()) == 1;
  if (!ok) return make_status(StatusCode::internal, "AES-256-GCM encryption failed");
  return tag;
}

Status open(const Key256& key, const Nonce& nonce, std::span<const std::byte> ad, std::span<const std::byte> cipher,
            const Tag& tag, std::span<std::byte> out) {
  if (out.size() < cipher.size()) return make_status(StatusCode::invalid_argument, "open: output shorter than input");
  EVP_CIPHER_CTX* c = thread_ctx();
  int len = 0;
  Tag t = tag;
  const bool ok = c && EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), nullptr, key.data(), nonce.data()) == 1 &&
                  (ad.empty() || EVP_DecryptUpdate(c, nullptr, &len, u8(ad.data()), int(ad.size())) == 1) &&
                  (cipher.empty() || EVP_DecryptUpdate(c, reinterpret_cast<unsigned char*>(out.data()), &len,
                                                       u8(cipher.data()), int(cipher.size())) == 1) &&
                  EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, int(t.size()), t.data()) == 1;
  if (!ok) return make_status(StatusCode::internal, "AES-256-GCM decryption failed to start");
  if (EVP_DecryptFinal_ex(c, nullptr, &len) != 1)
    return make_status(StatusCode::corrupt_data, "authentication failed (AES-256-GCM tag mismatch)");
  return {};
}

}  // namespace kvstream::security

#include "transport/tcp/kernel_tls.hpp"

#include <linux/tls.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <openssl/crypto.h>

#include "transport/tcp/tcp_socket.hpp"

#ifndef SOL_TLS
#define SOL_TLS 282
#endif
#ifndef TCP_ULP
#define TCP_ULP 31
#endif

namespace kvstream::transport::tcp {
namespace {

template <typename Info>
Status install(int fd, const security::TrafficKey& key, bool send, int cipher_type) {
  Info info{};
  info.info.version = TLS_1_3_VERSION;
  info.info.cipher_type = uint16_t(cipher_type);
  // The kernel splits the 12-byte TLS 1.3 IV into a 4-byte salt and an 8-byte iv.
  std::memcpy(info.salt, key.iv.data(), sizeof info.salt);
  std::memcpy(info.iv, key.iv.data() + sizeof info.salt, sizeof info.iv);
  std::memcpy(info.key, key.key.data(), sizeof info.key);
  const int rc = setsockopt(fd, SOL_TLS, send ? TLS_TX : TLS_RX, &info, sizeof info);
  const int err = errno;
  OPENSSL_cleanse(&info, sizeof info);
  if (rc == 0) return {};
  return make_status(err == ENOPROTOOPT || err == EINVAL || err == EOPNOTSUPP ? StatusCode::unsupported
                                                                                : StatusCode::io_error,
                     "kernel TLS: {} key refused: {}", send ? "send" : "receive", errno_text(err));
}

}  // namespace

Status attach_kernel_tls(int fd) {
  if (setsockopt(fd, SOL_TCP, TCP_ULP, "tls", sizeof "tls") == 0) return {};
  const int err = errno;
  return make_status(err == ENOENT || err == ENOPROTOOPT || err == EOPNOTSUPP ? StatusCode::unsupported
                                                                               : StatusCode::io_error,
                     "kernel TLS: this kernel has no tls module (TCP_ULP \"tls\": {})", errno_text(err));
}

Status install_kernel_tls(int fd, const security::TrafficKey& key, bool send) {
  if (key.key_bytes == 32)
    return install<tls12_crypto_info_aes_gcm_256>(fd, key, send, TLS_CIPHER_AES_GCM_256);
  return install<tls12_crypto_info_aes_gcm_128>(fd, key, send, TLS_CIPHER_AES_GCM_128);
}

}  // namespace kvstream::transport::tcp

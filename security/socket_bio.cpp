// A socket BIO that writes with send(MSG_NOSIGNAL): see socket_bio.hpp.
#include "security/socket_bio.hpp"

#include <openssl/bio.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>

#include "security/tls_context.hpp"

namespace kvstream::security {

namespace {

int fd_of(BIO* b) { return int(reinterpret_cast<intptr_t>(BIO_get_data(b))); }

int bio_write(BIO* b, const char* data, int len) {
  BIO_clear_retry_flags(b);
  const ssize_t n = ::send(fd_of(b), data, size_t(len), MSG_NOSIGNAL);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_write(b);
  return int(n);
}

int bio_read(BIO* b, char* data, int len) {
  BIO_clear_retry_flags(b);
  const ssize_t n = ::recv(fd_of(b), data, size_t(len), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(b);
  return int(n);
}

long bio_ctrl(BIO* b, int cmd, long, void* ptr) {
  switch (cmd) {
    case BIO_CTRL_FLUSH:
      return 1;  // nothing buffered here
    case BIO_C_GET_FD:
      if (ptr) *static_cast<int*>(ptr) = fd_of(b);
      return fd_of(b);
    default:
      return 0;  // no kTLS through OpenSSL: the record layer runs outside it (tls_keys.hpp)
  }
}

BIO_METHOD* nosignal_socket_method() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m =
        BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR, "kvstream socket");
    if (!m) return m;
    BIO_meth_set_write(m, bio_write);
    BIO_meth_set_read(m, bio_read);
    BIO_meth_set_ctrl(m, bio_ctrl);
    BIO_meth_set_create(m, [](BIO* b) {
      BIO_set_init(b, 1);
      return 1;
    });
    return m;
  }();
  return method;
}

}  // namespace

Status attach_socket(SSL* ssl, int fd) {
  BIO_METHOD* method = nosignal_socket_method();
  BIO* bio = method ? BIO_new(method) : nullptr;
  if (!bio) return make_status(StatusCode::internal, "tls: BIO_new: {}", openssl_errors());
  BIO_set_data(bio, reinterpret_cast<void*>(intptr_t(fd)));
  SSL_set_bio(ssl, bio, bio);  // the session owns it now
  return {};
}

}  // namespace kvstream::security

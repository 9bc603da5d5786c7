// A storage-protocol peer over a plain TCP socket, for the tests and benchmarks that
// act as a hostile or careless client would: it binds any loopback source address,
// frames messages by hand (docs/wire-tcp.md), and can stop half way through a body.
#pragma once

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "storage/protocol.hpp"
#include "transport/tcp/tcp_framing.hpp"

namespace kvstream::testing {

class RawPeer {
 public:
  RawPeer() = default;
  RawPeer(const RawPeer&) = delete;
  RawPeer(RawPeer&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  RawPeer& operator=(RawPeer&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~RawPeer() {
    if (fd_ >= 0) ::close(fd_);
  }

  /// Connects to "127.0.0.1:port" from `source` (any 127.x.y.z). False on failure.
  bool connect(const std::string& server, const std::string& source = "127.0.0.1") {
    const auto colon = server.rfind(':');
    sockaddr_in to{}, from{};
    to.sin_family = from.sin_family = AF_INET;
    to.sin_port = htons(uint16_t(std::stoi(server.substr(colon + 1))));
    if (inet_pton(AF_INET, server.substr(0, colon).c_str(), &to.sin_addr) != 1) return false;
    if (inet_pton(AF_INET, source.c_str(), &from.sin_addr) != 1) return false;
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return false;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) return false;
    return ::connect(fd_, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0;
  }

  /// Reads one whole message (header; the body is read and dropped) within `ms`.
  std::optional<storage::Response> read_response(int ms = 5000) {
    std::byte prefix[transport::tcp::kTcpPrefixBytes];
    if (!read_exact(prefix, sizeof prefix, ms)) return std::nullopt;
    const uint32_t hlen = transport::tcp::load_le32(prefix + 4);
    const uint64_t blen = transport::tcp::load_le64(prefix + 8);
    if (hlen > transport::kMaxHeaderBytes || blen > (uint64_t(64) << 20)) return std::nullopt;
    std::vector<std::byte> h(hlen), b(blen);
    if (!read_exact(h.data(), hlen, ms) || !read_exact(b.data(), blen, ms)) return std::nullopt;
    auto r = storage::decode_response(h);
    if (!r.ok()) return std::nullopt;
    return *r;
  }

  /// Reads the hello and answers it for `ns` with `secret`; true when the node says ok.
  bool authenticate(const std::string& ns, const std::string& secret) {
    auto hello = read_response();
    if (!hello || hello->op != storage::Op::hello) return false;
    first_id_ = storage::first_request_id(hello->nonce);
    storage::Request a;
    a.op = storage::Op::auth, a.name_space = ns, a.mac = storage::auth_mac(secret, hello->nonce, ns);
    if (!send_message(storage::encode(a), 0, {})) return false;
    auto r = read_response();
    return r && r->code == StatusCode::ok;
  }

  /// Sends a message whose frame declares `body_len` body bytes, followed by `body`
  /// (which may be shorter: the rest is never sent).
  bool send_message(const std::vector<std::byte>& header, uint64_t body_len, std::span<const std::byte> body) {
    std::vector<std::byte> out(transport::tcp::kTcpPrefixBytes);
    transport::tcp::encode_prefix(out.data(), uint32_t(header.size()), body_len);
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), body.begin(), body.end());
    return write_all(out.data(), out.size());
  }

  bool write_all(const void* p, size_t n) {
    const auto* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::send(fd_, c, n, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      c += w, n -= size_t(w);
    }
    return true;
  }

  /// True once the node has closed the connection (reads end), waiting up to `ms`.
  bool closed_by_peer(int ms) {
    char buf[4096];
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, ms);
      if (r <= 0) return false;
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
    }
  }

  [[nodiscard]] int fd() const { return fd_; }
  /// Where this connection's request ids start (from the node's hello; after
  /// authenticate).
  [[nodiscard]] uint64_t first_id() const { return first_id_; }

 private:
  bool read_exact(void* p, size_t n, int ms) {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      pollfd pf{fd_, POLLIN, 0};
      if (::poll(&pf, 1, ms) <= 0) return false;
      const ssize_t r = ::recv(fd_, c, n, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      c += r, n -= size_t(r);
    }
    return true;
  }
  int fd_ = -1;
  uint64_t first_id_ = 0;
};

}  // namespace kvstream::testing

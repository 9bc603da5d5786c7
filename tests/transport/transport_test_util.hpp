// Helpers shared by the transport test files.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kvstream/transport.hpp"
#include "tests/support/log_capture.hpp"
#include "transport/backends.hpp"  // the backend factories some tests call directly (test_tcp)

namespace kvstream::transport::test_util {

/// Deterministic pseudo-random bytes (xorshift), different per seed.
inline std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    b = std::byte(x);
  }
  return v;
}

/// True when `name` is built into this kvstream.
inline bool backend_built(const std::string& name) {
  const auto v = available_backends();
  return std::find(v.begin(), v.end(), name) != v.end();
}

/// Two backends of one configuration, a listener and a connected pair.
struct BackendPair {
  std::unique_ptr<Backend> server_backend, client_backend;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> server, client;
};

inline Result<BackendPair> make_backend_pair(const BackendConfig& cfg) {
  using namespace std::chrono_literals;
  BackendPair p;
  KVS_ASSIGN_OR_RETURN(p.server_backend, create_backend(cfg));
  KVS_ASSIGN_OR_RETURN(p.client_backend, create_backend(cfg));
  KVS_ASSIGN_OR_RETURN(p.listener, p.server_backend->listen("127.0.0.1:0"));
  auto accepted = std::async(std::launch::async, [&] { return p.listener->accept(deadline_in(10s), {}); });
  KVS_ASSIGN_OR_RETURN(p.client, p.client_backend->connect(p.listener->address(), deadline_in(10s), {}));
  auto srv = accepted.get();
  if (!srv.ok()) return srv.status();
  p.server = std::move(srv).value();
  return p;
}

/// Forwards TCP between clients and a node (loopback), for fault injection: pause()
/// stops forwarding in both directions (the node looks alive but never answers: a
/// stalled node); flip_at(n) inverts the byte at offset n of the node-to-client stream
/// of the next connection (bytes flipped on the wire); cut() closes every connection
/// made so far (a node that closed them, or a middlebox that reset them), and later
/// ones are forwarded as before.
class TcpProxy {
 public:
  explicit TcpProxy(const std::string& target) {
    const auto colon = target.rfind(':');
    target_port_ = uint16_t(std::stoi(target.substr(colon + 1)));
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 64) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      std::abort();  // a test machine without loopback sockets
    address_ = fmt::format("127.0.0.1:{}", ntohs(a.sin_port));
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~TcpProxy() {
    stop_ = true;
    acceptor_.join();
    for (auto& t : pumps_) t.join();
    ::close(listen_fd_);
  }
  const std::string& address() const { return address_; }
  void pause(bool p) { paused_ = p; }
  /// The next accepted connection gets byte `offset` of its node-to-client stream
  /// inverted; negative: no corruption.
  void flip_at(int64_t offset) { flip_next_ = offset; }
  /// Closes the connections accepted so far, paused or not.
  void cut() { ++cut_; }
  /// Client-to-node bytes are read and dropped (counted in swallowed()), as if lost
  /// on the way: the node never sees them.
  void swallow_requests(bool on) { swallow_ = on; }
  [[nodiscard]] uint64_t swallowed() const { return swallowed_; }
  /// Node-to-client bytes stay with the node (not read) while on: the node does
  /// what it is asked, its answers do not arrive.
  void hold_replies(bool on) { hold_replies_ = on; }
  /// Connections whose pump is still running (cut() ends them).
  [[nodiscard]] int open_connections() const { return open_; }

 private:
  int listen_fd_ = -1;
  uint16_t target_port_ = 0;
  std::string address_;
  std::atomic<bool> stop_{false}, paused_{false}, swallow_{false}, hold_replies_{false};
  std::atomic<uint64_t> swallowed_{0};
  std::atomic<int> open_{0};
  std::atomic<int64_t> flip_next_{-1};
  std::atomic<uint64_t> cut_{0};  // bumped by cut(): pumps of an older count close
  std::thread acceptor_;
  std::vector<std::thread> pumps_;

  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(target_port_);
      if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(c), ::close(s);
        continue;
      }
      ++open_;
      pumps_.emplace_back([this, c, s, flip = flip_next_.exchange(-1), era = cut_.load()] {
        pump(c, s, flip, era);
        --open_;
      });
    }
  }

  void pump(int a, int b, int64_t flip, uint64_t era) {
    std::vector<char> buf(1 << 16);
    int64_t from_node = 0;  // bytes forwarded from the node (b) so far
    bool open = true;
    while (open && !stop_ && cut_ == era) {
      if (paused_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      pollfd p[2] = {{a, POLLIN, 0}, {b, short(hold_replies_ ? 0 : POLLIN), 0}};
      if (::poll(p, 2, 20) <= 0) continue;
      for (int i = 0; i < 2 && open; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::read(p[i].fd, buf.data(), buf.size());
        if (n <= 0) {
          open = false;
          break;
        }
        if (i == 0 && swallow_) {
          swallowed_ += uint64_t(n);
          continue;
        }
        if (i == 1) {
          if (flip >= from_node && flip < from_node + n) buf[size_t(flip - from_node)] ^= char(0xff);
          from_node += n;
        }
        for (ssize_t off = 0; off < n;) {
          // MSG_NOSIGNAL: the far side may have closed already (a client that caught
          // a flipped byte), and a plain write would then kill the test with SIGPIPE.
          const ssize_t w = ::send(p[1 - i].fd, buf.data() + off, size_t(n - off), MSG_NOSIGNAL);
          if (w <= 0) {
            open = false;
            break;
          }
          off += w;
        }
      }
    }
    ::close(a), ::close(b);
  }
};

/// Accepts with a deadline already due, polled until one succeeds, while a client
/// connects (three rounds): a connection the client is already making must not be
/// dropped because an accept round ended during its setup (a storage node accepts in
/// 200 ms rounds, and a loaded machine's setup can outlast one). The accepted
/// connection is the client's and works both ways. Fatal failures end the caller.
inline void accept_past_its_deadline_loses_no_connection(const BackendConfig& cfg) {
  using namespace std::chrono_literals;
  auto sb = create_backend(cfg);
  auto cb = create_backend(cfg);
  ASSERT_TRUE(sb.ok() && cb.ok());
  auto l = (*sb)->listen("127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  for (int round = 0; round < 3; ++round) {
    // The minute is only a hang guard.
    auto client = std::async(std::launch::async, [&] { return (*cb)->connect((*l)->address(), deadline_in(60s), {}); });
    std::unique_ptr<Connection> server;
    for (const auto give_up = deadline_in(60s); !server && Clock::now() < give_up;) {
      auto a = (*l)->accept(Clock::now(), {});
      if (a.ok()) {
        server = std::move(a).value();
      } else {
        ASSERT_EQ(a.status().code(), StatusCode::timed_out) << a.status().to_string();
        std::this_thread::sleep_for(1ms);
      }
    }
    ASSERT_TRUE(server) << "round " << round << ": no connection accepted";
    auto c = client.get();
    ASSERT_TRUE(c.ok()) << "round " << round << ": " << c.status().to_string();
    const std::byte h[2] = {std::byte(round), std::byte(7)};
    std::vector<std::byte> got;
    ASSERT_TRUE((*c)->send(h, {}, deadline_in(5s), {}).ok());
    auto len = server->recv_header(got, deadline_in(5s), {});
    ASSERT_TRUE(len.ok()) << "round " << round << ": " << len.status().to_string();
    EXPECT_EQ(got, std::vector<std::byte>(h, h + 2));
    ASSERT_TRUE(server->send(h, {}, deadline_in(5s), {}).ok());
    len = (*c)->recv_header(got, deadline_in(5s), {});
    ASSERT_TRUE(len.ok()) << "round " << round << ": " << len.status().to_string();
    EXPECT_EQ(got, std::vector<std::byte>(h, h + 2));
  }
}

/// The next message on `accepted` (a connection a listener accepted), whose peer sent
/// a malformed one: corrupt_data, and nothing at warn in the log (the listener's owner
/// logs what it is given; a node through its rate limit).
inline void expect_malformed_without_warning(Connection& accepted) {
  using namespace std::chrono_literals;
  kvstream::testing::LogCapture log;
  std::vector<std::byte> h;
  auto r = accepted.recv_header(h, deadline_in(30s), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::corrupt_data) << r.status().to_string();
  const auto warnings = log.warnings();
  EXPECT_TRUE(warnings.empty()) << warnings.size() << " lines at warn or above, the first: " << warnings.front();
}

}  // namespace kvstream::transport::test_util

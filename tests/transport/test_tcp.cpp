// tcp backend specifics: framing checks against a raw (malformed) peer, partial
// messages and stalls, and the zero-copy send path. Throughput is kvstream-perf's
// (docs/wire-tcp.md has the commands).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <thread>

#include "kvstream/transport.hpp"
#include "transport/backends.hpp"
#include "transport/common/address.hpp"
#include "transport/common/registration.hpp"
#include "transport/tcp/tcp_framing.hpp"
#include "tests/support/log_capture.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::test_tcp {

using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace tcpb = kvstream::transport::tcp;

namespace {

using kvstream::transport::test_util::pattern;

std::unique_ptr<Backend> backend(const kvstream::transport::TcpSettings& opt = {}) {
  BackendConfig cfg;
  cfg.tcp = opt;
  auto b = kvstream::transport::create_backend(cfg);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return b.ok() ? std::move(b).value() : nullptr;
}

/// How long a raw peer waits to see the backend close a connection: a hang guard, not
/// a bound on how fast the close must come (a loaded machine may take seconds).
constexpr std::chrono::milliseconds kCloseGuard{60000};

/// A plain blocking socket playing a (possibly malformed) peer.
struct RawPeer {
  int fd = -1;
  ~RawPeer() {
    if (fd >= 0) close(fd);
  }
  bool connect_to(const std::string& address) {
    const auto colon = address.rfind(':');
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(uint16_t(std::stoi(address.substr(colon + 1))));
    inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  }
  void write_all(const void* p, size_t n) {
    const auto* b = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL);
      ASSERT_GT(w, 0);
      b += w;
      n -= size_t(w);
    }
  }
  void write_prefix(uint32_t magic, uint32_t header_len, uint64_t body_len) {
    std::byte p[tcpb::kTcpPrefixBytes];
    tcpb::encode_prefix(p, header_len, body_len, magic);
    write_all(p, sizeof p);
  }
  /// True when the other side closed (recv returns 0 or a reset) within `wait`.
  bool sees_close(std::chrono::milliseconds wait) {
    timeval tv{long(wait.count() / 1000), long(wait.count() % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::vector<char> c(64 * 1024);  // drains whatever was still in flight
    for (;;) {
      const ssize_t r = ::recv(fd, c.data(), c.size(), 0);
      if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
      if (r < 0) return false;  // timeout
    }
  }
};

/// A tcp listener with one raw peer connected to it.
struct RawSetup {
  std::unique_ptr<Backend> b;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> server;
  RawPeer peer;
};

void make_raw(RawSetup& s) {
  s.b = backend();
  ASSERT_TRUE(s.b);
  auto l = s.b->listen("127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  s.listener = std::move(l).value();
  ASSERT_TRUE(s.peer.connect_to(s.listener->address()));
  auto c = s.listener->accept(deadline_in(5s), {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  s.server = std::move(c).value();
}

struct Pair {
  std::unique_ptr<Backend> a, b;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> server, client;
};

void make_pair(Pair& p, const kvstream::transport::TcpSettings& opt = {}) {
  p.a = backend(opt);
  p.b = backend(opt);
  ASSERT_TRUE(p.a && p.b);
  auto l = p.a->listen("127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  p.listener = std::move(l).value();
  auto accepted = std::async(std::launch::async, [&] { return p.listener->accept(deadline_in(10s), {}); });
  auto c = p.b->connect(p.listener->address(), deadline_in(10s), {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  p.client = std::move(c).value();
  auto s = accepted.get();
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  p.server = std::move(s).value();
}

void expect_corrupt_then_closed(RawSetup& s) {
  std::vector<std::byte> h;
  auto r = s.server->recv_header(h, deadline_in(5s), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::corrupt_data) << r.status().to_string();
  EXPECT_TRUE(s.peer.sees_close(kCloseGuard));  // the backend closed the connection
  auto again = s.server->recv_header(h, deadline_in(1s), {});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::unavailable) << again.status().to_string();
  std::byte one[1] = {};
  EXPECT_EQ(s.server->send(one, {}, deadline_in(1s), {}).code(), StatusCode::unavailable);
}

}  // namespace

TEST(tcp, CapabilitiesAndDescribe) {
  auto b = backend();
  ASSERT_TRUE(b);
  const Capabilities& c = b->capabilities();
  EXPECT_EQ(c.backend, "tcp");
  EXPECT_EQ(c.provider, "io_uring");
  EXPECT_FALSE(c.cuda_memory);
  EXPECT_FALSE(c.one_sided_read);
  EXPECT_GE(c.max_message_bytes, uint64_t(1) << 30);

  BackendConfig cuda;
  cuda.memory = MemoryType::cuda;
  auto bad = make_tcp_backend(cuda);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::unsupported);
  EXPECT_NE(bad.status().message().find("cuda"), std::string::npos);
  EXPECT_FALSE(b->register_memory(&cuda, sizeof cuda, MemoryType::cuda).ok());
  EXPECT_FALSE(b->register_memory(&cuda, 0, MemoryType::host).ok());

  Pair p;
  make_pair(p);
  const std::string addr = p.listener->address();
  EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << addr;
  EXPECT_NE(addr, "127.0.0.1:0");
  EXPECT_EQ(p.server->describe().rfind("tcp 127.0.0.1:", 0), 0u) << p.server->describe();
  EXPECT_EQ(p.client->describe(), "tcp " + addr + " (io_uring)");
}

TEST(tcp, BadMagicIsCorruptDataAndCloses) {
  RawSetup s;
  make_raw(s);
  s.peer.write_prefix(0xdeadbeef, 4, 0);
  s.peer.write_all("abcd", 4);
  expect_corrupt_then_closed(s);
}

TEST(tcp, HeaderLenTooLargeIsCorruptData) {
  RawSetup s;
  make_raw(s);
  s.peer.write_prefix(tcpb::kTcpMagic, uint32_t(kMaxHeaderBytes + 1), 0);
  expect_corrupt_then_closed(s);
}

TEST(tcp, BodyLenTooLargeIsCorruptData) {
  RawSetup s;
  make_raw(s);
  s.peer.write_prefix(tcpb::kTcpMagic, 0, tcpb::kTcpMaxBodyBytes + 1);
  expect_corrupt_then_closed(s);
  RawSetup s2;
  make_raw(s2);
  s2.peer.write_prefix(tcpb::kTcpMagic, 0xffffffffu, ~uint64_t(0));
  expect_corrupt_then_closed(s2);
}

TEST(tcp, StalledHeaderTimesOutAndResumes) {
  RawSetup s;
  make_raw(s);
  const auto header = pattern(100, 1);
  s.peer.write_prefix(tcpb::kTcpMagic, 100, 0);
  s.peer.write_all(header.data(), 40);  // then stalls
  std::vector<std::byte> h;
  const auto deadline = deadline_in(300ms);
  auto r = s.server->recv_header(h, deadline, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::timed_out) << r.status().to_string();
  EXPECT_GE(Clock::now(), deadline);  // timed_out only once the deadline passed
  // The partial prefix/header is kept: the same message completes on the next call.
  s.peer.write_all(header.data() + 40, 60);
  auto r2 = s.server->recv_header(h, deadline_in(5s), {});
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  EXPECT_EQ(*r2, 0u);
  EXPECT_EQ(h, header);
}

TEST(tcp, StalledBodyTimesOutThenConnectionIsBroken) {
  RawSetup s;
  make_raw(s);
  const auto body = pattern(1 << 20, 2);
  s.peer.write_prefix(tcpb::kTcpMagic, 3, body.size());
  s.peer.write_all("hdr", 3);
  s.peer.write_all(body.data(), body.size() / 2);  // half the body, then stalls
  std::vector<std::byte> h;
  auto len = s.server->recv_header(h, deadline_in(5s), {});
  ASSERT_TRUE(len.ok()) << len.status().to_string();
  ASSERT_EQ(*len, body.size());
  std::vector<std::byte> dest(body.size());
  auto mr = s.b->register_memory(dest.data(), dest.size(), MemoryType::host);
  ASSERT_TRUE(mr.ok());
  const auto deadline = deadline_in(300ms);
  Status st = s.server->recv_body(mr->span(0, body.size()), deadline, {});
  EXPECT_EQ(st.code(), StatusCode::timed_out) << st.to_string();
  EXPECT_GE(Clock::now(), deadline);
  EXPECT_EQ(std::memcmp(dest.data(), body.data(), body.size() / 2), 0);
  // The stream position is lost: the connection is now closed.
  auto again = s.server->recv_header(h, deadline_in(1s), {});
  EXPECT_EQ(again.status().code(), StatusCode::unavailable) << again.status().to_string();
  EXPECT_TRUE(s.peer.sees_close(kCloseGuard));
}

TEST(tcp, CancelDuringBodyIsCancelledThenBroken) {
  RawSetup s;
  make_raw(s);
  s.peer.write_prefix(tcpb::kTcpMagic, 0, 1000);
  s.peer.write_all("0123456789", 10);
  std::vector<std::byte> h;
  ASSERT_TRUE(s.server->recv_header(h, deadline_in(5s), {}).ok());
  CancelToken cancel;
  std::thread t([cancel] {
    std::this_thread::sleep_for(100ms);
    cancel.cancel();
  });
  std::vector<std::byte> dest(1000);
  auto mr = s.b->register_memory(dest.data(), dest.size(), MemoryType::host);
  // The deadline is an hour away: only the cancel can end this wait.
  Status st = s.server->recv_body(mr->span(0, 1000), deadline_in(std::chrono::hours(1)), cancel);
  t.join();
  EXPECT_EQ(st.code(), StatusCode::cancelled) << st.to_string();
  EXPECT_EQ(s.server->recv_body(mr->span(0, 1000), deadline_in(1s), {}).code(), StatusCode::unavailable);
}

TEST(tcp, TruncatedMessageThenCloseIsUnavailable) {
  {  // closed inside the header: broken framing. This side accepted the connection,
     // so the peer's doing is logged at debug (the listener's owner rate-limits what it
     // logs; a close between two messages is at debug on either side).
    RawSetup s;
    make_raw(s);
    s.peer.write_prefix(tcpb::kTcpMagic, 50, 0);
    s.peer.write_all("short", 5);
    close(s.peer.fd);
    s.peer.fd = -1;
    kvstream::testing::LogCapture log(LogLevel::debug);
    std::vector<std::byte> h;
    auto r = s.server->recv_header(h, deadline_in(5s), {});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::unavailable) << r.status().to_string();
    EXPECT_NE(r.status().message().find("127.0.0.1"), std::string::npos) << r.status().to_string();
    const auto lines = log.lines();
    const auto it = std::find_if(lines.begin(), lines.end(), [](const auto& l) {
      return l.second.find("in the middle of a message") != std::string::npos;
    });
    ASSERT_NE(it, lines.end());
    EXPECT_EQ(it->first, LogLevel::debug) << it->second;
  }
  {  // closed inside the body
    RawSetup s;
    make_raw(s);
    s.peer.write_prefix(tcpb::kTcpMagic, 1, 5000);
    s.peer.write_all("h", 1);
    s.peer.write_all(pattern(1234, 3).data(), 1234);
    close(s.peer.fd);
    s.peer.fd = -1;
    std::vector<std::byte> h;
    auto len = s.server->recv_header(h, deadline_in(5s), {});
    ASSERT_TRUE(len.ok()) << len.status().to_string();
    std::vector<std::byte> dest(5000);
    auto mr = s.b->register_memory(dest.data(), dest.size(), MemoryType::host);
    Status st = s.server->recv_body(mr->span(0, 5000), deadline_in(5s), {});
    EXPECT_EQ(st.code(), StatusCode::unavailable) << st.to_string();
    EXPECT_NE(st.message().find("127.0.0.1"), std::string::npos) << st.to_string();
  }
}

TEST(tcp, BodyMustBeReadOrDiscarded) {
  Pair p;
  make_pair(p);
  std::vector<std::byte> buf(300000);
  auto mr = p.b->register_memory(buf.data(), buf.size(), MemoryType::host);
  auto rmr = p.a->register_memory(buf.data(), buf.size(), MemoryType::host);
  ASSERT_TRUE(mr.ok() && rmr.ok());
  const std::byte h[2] = {std::byte(1), std::byte(2)};
  ASSERT_TRUE(p.client->send(h, mr->span(0, 300000), deadline_in(5s), {}).ok());
  ASSERT_TRUE(p.client->send(h, mr->span(0, 10), deadline_in(5s), {}).ok());
  std::vector<std::byte> got;
  ASSERT_EQ(p.server->recv_header(got, deadline_in(5s), {}).value_or(0), 300000u);
  // A second header before the body is a caller error; a too-small destination too.
  EXPECT_EQ(p.server->recv_header(got, deadline_in(1s), {}).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(p.server->recv_body(rmr->span(0, 10), deadline_in(1s), {}).code(), StatusCode::invalid_argument);
  ASSERT_TRUE(p.server->recv_body({}, deadline_in(5s), {}).ok());  // discard
  ASSERT_EQ(p.server->recv_header(got, deadline_in(5s), {}).value_or(0), 10u);
  ASSERT_TRUE(p.server->recv_body(rmr->span(0, 10), deadline_in(5s), {}).ok());
}

namespace {

/// Round trips of every size with the receiver running concurrently (as a real
/// stream transport needs for bodies larger than the socket buffers).
void round_trips(const kvstream::transport::TcpSettings& opt) {
  Pair p;
  make_pair(p, opt);
  const size_t max = size_t(64) << 20;
  std::vector<std::byte> send_buf(max), recv_buf(max);
  auto smr = p.b->register_memory(send_buf.data(), max, MemoryType::host);
  auto rmr = p.a->register_memory(recv_buf.data(), max, MemoryType::host);
  ASSERT_TRUE(smr.ok() && rmr.ok());
  for (size_t n : {size_t(0), size_t(1), size_t(65535), size_t(65536), size_t(1) << 20, size_t(16) << 20, max}) {
    const auto body = pattern(n, uint32_t(n));
    if (n > 0) std::memcpy(send_buf.data(), body.data(), n);
    const auto header = pattern(1 + n % 4096, 7);
    auto received = std::async(std::launch::async, [&]() -> Status {
      std::vector<std::byte> got_header;
      auto len = p.server->recv_header(got_header, deadline_in(20s), {});
      if (!len.ok()) return len.status();
      if (*len != n || got_header != header) return Status(StatusCode::internal, "header mismatch");
      return p.server->recv_body(rmr->span(0, n), deadline_in(20s), {});
    });
    Status st = p.client->send(header, smr->span(0, n), deadline_in(20s), {});
    ASSERT_TRUE(st.ok()) << st.to_string();
    Status rs = received.get();
    ASSERT_TRUE(rs.ok()) << rs.to_string();
    if (n > 0) EXPECT_EQ(std::memcmp(recv_buf.data(), body.data(), n), 0) << n;
  }
}

}  // namespace

TEST(tcp, LargeRoundTripsWithConcurrentReceiver) { round_trips({}); }

TEST(tcp, SendZeroCopyPathEqualsPlainPath) {
  kvstream::transport::TcpSettings zc;
  zc.send_zc = true;
  zc.send_zc_min_bytes = 1;
  auto b = backend(zc);
  ASSERT_TRUE(b);
  EXPECT_NE(b->capabilities().backend, "");
  round_trips(zc);
}

namespace {

/// Many posted messages of mixed sizes (several chains, partly sent while more are
/// posted) arrive complete and in order.
void posted_mixed_sizes(const kvstream::transport::TcpSettings& opt) {
  Pair p;
  make_pair(p, opt);
  const size_t sizes[] = {0, 1, 100, 4096, 65535, 65536, 70001, size_t(1) << 20, size_t(3) << 20};
  const int count = 300;
  size_t total = 0;
  std::vector<size_t> offset, length;
  for (int i = 0; i < count; ++i) {
    offset.push_back(total);
    length.push_back(sizes[size_t(i) % std::size(sizes)]);
    total += length.back();
  }
  const auto data = pattern(total, 11);
  std::vector<std::byte> recv_buf(size_t(3) << 20);
  auto smr = p.b->register_memory(const_cast<std::byte*>(data.data()), total, MemoryType::host);
  auto rmr = p.a->register_memory(recv_buf.data(), recv_buf.size(), MemoryType::host);
  ASSERT_TRUE(smr.ok() && rmr.ok());
  auto receiver = std::async(std::launch::async, [&]() -> Status {
    std::vector<std::byte> h;
    for (int i = 0; i < count; ++i) {
      KVS_ASSIGN_OR_RETURN(size_t len, p.server->recv_header(h, deadline_in(20s), {}));
      uint32_t id = 0;
      if (h.size() == 4 + size_t(i % 7)) std::memcpy(&id, h.data(), 4);
      if (len != length[size_t(i)] || id != uint32_t(i))
        return make_status(StatusCode::internal, "message {}: id {}, {} bytes", i, id, len);
      KVS_RETURN_IF_ERROR(p.server->recv_body(rmr->span(0, len), deadline_in(20s), {}));
      if (len > 0 && std::memcmp(recv_buf.data(), data.data() + offset[size_t(i)], len) != 0)
        return make_status(StatusCode::internal, "message {}: body differs", i);
    }
    return {};
  });
  uint64_t last = 0;
  for (int i = 0; i < count; ++i) {
    std::vector<std::byte> h(4 + size_t(i % 7), std::byte(0xee));
    const uint32_t id = uint32_t(i);
    std::memcpy(h.data(), &id, 4);
    auto seq = p.client->post_send(h, smr->span(offset[size_t(i)], length[size_t(i)]));
    ASSERT_TRUE(seq.ok()) << seq.status().to_string();
    EXPECT_GT(*seq, last);
    last = *seq;
    if (i % 37 == 36) {
      Status st = p.client->wait_sends(last, deadline_in(20s), {});
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
  }
  Status st = p.client->wait_sends(last, deadline_in(20s), {});
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(p.client->wait_sends(last - 5, deadline_in(1s), {}).ok());  // already covered
  EXPECT_EQ(p.client->wait_sends(last + 1, deadline_in(1s), {}).code(), StatusCode::invalid_argument);
  // send() after posts: one path, same order.
  const std::byte one[1] = {std::byte(1)};
  Status rs = receiver.get();
  ASSERT_TRUE(rs.ok()) << rs.to_string();
  ASSERT_TRUE(p.client->send(one, {}, deadline_in(5s), {}).ok());
  std::vector<std::byte> h;
  auto len = p.server->recv_header(h, deadline_in(5s), {});
  ASSERT_TRUE(len.ok()) << len.status().to_string();
  EXPECT_EQ(*len, 0u);
  EXPECT_EQ(h.size(), 1u);
}

}  // namespace

TEST(tcp, PostedSendsOfMixedSizesKeepOrder) { posted_mixed_sizes({}); }

TEST(tcp, PostedSendsOfMixedSizesKeepOrderZeroCopy) {
  kvstream::transport::TcpSettings zc;
  zc.send_zc = true;
  zc.send_zc_min_bytes = 1;
  posted_mixed_sizes(zc);
}

TEST(tcp, WaitSendsToStalledPeerTimesOutThenBroken) {
  RawSetup s;
  make_raw(s);  // the raw peer never reads
  const size_t n = size_t(1) << 20;
  std::vector<std::byte> buf(n, std::byte(3));
  auto mr = s.b->register_memory(buf.data(), n, MemoryType::host);
  ASSERT_TRUE(mr.ok());
  const std::byte h[4] = {};
  uint64_t last = 0;
  for (int i = 0; i < 128; ++i) {  // far more than the socket buffers hold
    auto seq = s.server->post_send(h, mr->span(0, n));
    ASSERT_TRUE(seq.ok()) << seq.status().to_string();
    last = *seq;
  }
  const auto deadline = deadline_in(300ms);
  Status st = s.server->wait_sends(last, deadline, {});
  EXPECT_EQ(st.code(), StatusCode::timed_out) << st.to_string();
  EXPECT_GE(Clock::now(), deadline);
  EXPECT_EQ(s.server->post_send(h, mr->span(0, n)).status().code(), StatusCode::unavailable);
  EXPECT_EQ(s.server->wait_sends(last, deadline_in(1s), {}).code(), StatusCode::unavailable);
  EXPECT_TRUE(s.peer.sees_close(kCloseGuard));
}

TEST(tcp, CancelOfWaitSendsIsCancelledThenBroken) {
  RawSetup s;
  make_raw(s);
  const size_t n = size_t(1) << 20;
  std::vector<std::byte> buf(n, std::byte(3));
  auto mr = s.b->register_memory(buf.data(), n, MemoryType::host);
  const std::byte h[4] = {};
  uint64_t last = 0;
  for (int i = 0; i < 128; ++i) last = s.server->post_send(h, mr->span(0, n)).value();
  CancelToken cancel;
  std::thread t([cancel] {
    std::this_thread::sleep_for(100ms);
    cancel.cancel();
  });
  // The deadline is an hour away: only the cancel ends the wait, whether it comes
  // before the wait starts or during it (a queued send is then half sent either way).
  Status st = s.server->wait_sends(last, deadline_in(std::chrono::hours(1)), cancel);
  t.join();
  EXPECT_EQ(st.code(), StatusCode::cancelled) << st.to_string();
  EXPECT_EQ(s.server->wait_sends(last, deadline_in(1s), {}).code(), StatusCode::unavailable);
}

TEST(tcp, DestroyingAConnectionWithPostedSendsReturnsPromptly) {
  RawSetup s;
  make_raw(s);
  const size_t n = size_t(1) << 20;
  std::vector<std::byte> buf(n, std::byte(3));
  auto mr = s.b->register_memory(buf.data(), n, MemoryType::host);
  const std::byte h[4] = {};
  for (int i = 0; i < 128; ++i) ASSERT_TRUE(s.server->post_send(h, mr->span(0, n)).ok());
  // Takes the sends back from the kernel before buf goes away; a destructor that
  // waited on the peer would hang here (ctest's timeout), not return.
  s.server.reset();
  EXPECT_TRUE(s.peer.sees_close(kCloseGuard));
}

}  // namespace kvstream::test_tcp

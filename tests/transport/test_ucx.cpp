// UCX-specific tests: transports chosen by ucx_tls (tcp, shared memory), the cuda
// error, bodies received late (staged) and early (zero copy). Throughput and latency
// are kvstream-perf's (perf/kvstream_perf.cpp: --backend ucx --ucx-tls tcp).
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <thread>

#include "kvstream/transport.hpp"
#include "tests/transport/transport_test_util.hpp"
#include "transport/ucx/ucx_wire.hpp"
#if KVSTREAM_HAVE_UCX
#include "transport/common/address.hpp"
#include "transport/ucx/ucx_connection.hpp"
#endif

namespace kvstream::test_ucx {

using namespace kvstream::transport;
using namespace std::chrono_literals;

namespace {

bool have_ucx() {
  for (const auto& b : available_backends())
    if (b == "ucx") return true;
  return false;
}

using UcxPair = test_util::BackendPair;

BackendConfig ucx_config(const std::string& tls, bool peer_errors = true) {
  BackendConfig cfg;
  cfg.name = "ucx";
  cfg.ucx.tls = tls;
  cfg.ucx.peer_errors = peer_errors;
  return cfg;
}

Result<UcxPair> make_ucx_pair(const std::string& tls, bool peer_errors = true) {
  return test_util::make_backend_pair(ucx_config(tls, peer_errors));
}

std::vector<std::byte> fill(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(uint8_t(i * 31 + seed));
  return v;
}

void round_trips(const std::string& tls, const std::string& expect_tl) {
  auto p = make_ucx_pair(tls);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->client_backend->capabilities().provider, "UCX_TLS=" + tls);
  EXPECT_NE(p->client->describe().find(expect_tl), std::string::npos) << p->client->describe();
  EXPECT_NE(p->server->describe().find("ucx 127.0.0.1:"), std::string::npos) << p->server->describe();
  const size_t max = size_t(8) << 20;
  std::vector<std::byte> sbuf(max), rbuf(max);
  auto smr = p->client_backend->register_memory(sbuf.data(), max, MemoryType::host);
  auto rmr = p->server_backend->register_memory(rbuf.data(), max, MemoryType::host);
  ASSERT_TRUE(smr.ok() && rmr.ok());
  for (size_t n : {size_t(0), size_t(3), size_t(8192), size_t(300000), max}) {
    const auto body = fill(n, uint8_t(n));
    if (n) std::memcpy(sbuf.data(), body.data(), n);
    const auto header = fill(100, 9);
    // Receiver waits first (zero-copy path) on odd rounds, reads late (staged) on others.
    auto sent = std::async(std::launch::async,
                           [&] { return p->client->send(header, smr->span(0, n), deadline_in(10s), {}); });
    std::vector<std::byte> h;
    auto len = p->server->recv_header(h, deadline_in(10s), {});
    ASSERT_TRUE(len.ok()) << len.status().to_string();
    ASSERT_EQ(*len, n);
    EXPECT_EQ(h, header);
    std::memset(rbuf.data(), 0, n);
    Status rb = p->server->recv_body(rmr->span(0, n), deadline_in(10s), {});
    ASSERT_TRUE(rb.ok()) << rb.to_string();
    Status sb = sent.get();
    ASSERT_TRUE(sb.ok()) << sb.to_string();
    if (n) EXPECT_EQ(std::memcmp(rbuf.data(), body.data(), n), 0) << n;
  }
}

// The wire tag: kind in the top 8 bits, then the receiver's 24-bit rx id, then the
// 32-bit sequence; every field comes back out, and rx ids are cut to their field.
TEST(ucx, TagLayoutPutsKindFirst) {
  using namespace kvstream::transport::ucx_detail;
  const uint64_t t = make_tag(0xabcdef, kBodyKind, 0x12345678);
  EXPECT_EQ(t, (kBodyKind << 56) | (uint64_t(0xabcdef) << 32) | 0x12345678u);
  const TagFields f = Tag::unpack(t);
  EXPECT_EQ(f.kind, kBodyKind);
  EXPECT_EQ(f.conn, 0xabcdefu);
  EXPECT_EQ(f.seq, 0x12345678u);
  EXPECT_EQ(kRxIdMask, 0xffffffu);
  EXPECT_EQ(make_tag(0x1abcdef, kHeaderKind, 0), make_tag(0xabcdef, kHeaderKind, 0));
  EXPECT_NE(make_tag(1, kHeaderKind, 7), make_tag(1, kBodyKind, 7));
}

TEST(ucx, TcpRoundTrips) {
  if (!have_ucx()) GTEST_SKIP() << "ucx backend not built";
  round_trips("tcp", "tcp");
}

// A node that crashed comes back on its port at once: the port's connections that the
// listening side closed first linger in TIME_WAIT, and a new listener must bind over
// them (as the tcp backend's does, with SO_REUSEADDR). Without it UCX refused the
// port for a minute ("Device is busy"), and kvstream-node-checker --backend ucx could
// not restart its node after a kill.
TEST(ucx, AListenerComesBackOnItsPortWhileItsConnectionsLinger) {
  if (!have_ucx()) GTEST_SKIP() << "ucx backend not built";
  const BackendConfig cfg = ucx_config("tcp");
  std::string address;
  {
    auto p = test_util::make_backend_pair(cfg);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    address = p->listener->address();
    ASSERT_TRUE(p->client->send(fill(16, 1), {}, deadline_in(10s), {}).ok());
    std::vector<std::byte> h;
    ASSERT_TRUE(p->server->recv_header(h, deadline_in(10s), {}).ok());
    // The listening side closes first, as a node that is stopped or killed does.
    p->server.reset();
    p->listener.reset();
    p->server_backend.reset();
  }
  auto again = create_backend(cfg);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  auto l = (*again)->listen(address);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
}

TEST(ucx, SharedMemoryRoundTrips) {
  if (!have_ucx()) GTEST_SKIP() << "ucx backend not built";
  // UCX 1.13 needs tcp beside shared memory for sockaddr connection establishment;
  // messages then go over posix shared memory (rendezvous over tcp: cma does not
  // support peer-failure handling, which this backend asks for).
  round_trips("posix,cma,tcp", "posix");
}

TEST(ucx, CudaMemoryIsAClearError) {
  if (!have_ucx()) GTEST_SKIP() << "ucx backend not built";
  BackendConfig cfg;
  cfg.name = "ucx";
  cfg.memory = MemoryType::cuda;
  auto b = create_backend(cfg);
  if (b.ok()) GTEST_SKIP() << "this UCX has cuda transports";
  EXPECT_EQ(b.status().code(), StatusCode::unsupported);
  EXPECT_NE(b.status().message().find("cuda"), std::string::npos) << b.status().to_string();
  cfg.memory = MemoryType::host;
  auto h = create_backend(cfg);
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE((*h)->capabilities().cuda_memory);
  int x = 0;
  auto r = (*h)->register_memory(&x, sizeof x, MemoryType::cuda);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::unsupported);
}

TEST(ucx, BadTlsIsAnError) {
  if (!have_ucx()) GTEST_SKIP() << "ucx backend not built";
  const BackendConfig cfg = ucx_config("no_such_transport");
  auto b = create_backend(cfg);
  if (!b.ok()) return;  // refused at init
  // Some UCX versions accept unknown names and fail when nothing is usable.
  auto l = (*b)->listen("127.0.0.1:0");
  if (!l.ok()) return;
  auto c = (*b)->connect((*l)->address(), deadline_in(1s), {});
  EXPECT_FALSE(c.ok());
}

// A wait_sends that times out (nobody reads 64 MiB) breaks the connection: later
// posts fail with unavailable.
TEST(ucx, InterruptedWaitSendsBreaksTheConnection) {
  if (!have_ucx()) GTEST_SKIP() << "ucx backend not built";
  auto p = make_ucx_pair("tcp");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  const size_t n = size_t(64) << 20;
  std::vector<std::byte> buf(n);
  auto mr = p->client_backend->register_memory(buf.data(), n, MemoryType::host);
  ASSERT_TRUE(mr.ok());
  uint64_t last = 0;
  for (int i = 0; i < 16; ++i) {
    auto seq = p->client->post_send({}, mr->span(0, n));
    ASSERT_TRUE(seq.ok()) << seq.status().to_string();
    last = *seq;
  }
  Status s = p->client->wait_sends(last, deadline_in(100ms), {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::timed_out) << s.to_string();
  auto again = p->client->post_send({}, {});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::unavailable) << again.status().to_string();
  EXPECT_FALSE(p->client->wait_sends(last, deadline_in(1s), {}).ok());
}

// ucx.peer_errors = false drops peer failure detection so that UCX may use
// transports without it (cma for large shared memory messages).
TEST(ucx, WithoutPeerErrorHandling) {
  if (!have_ucx()) GTEST_SKIP() << "ucx backend not built";
  {
    auto p = make_ucx_pair("shm,tcp", false);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    const size_t n = size_t(4) << 20;
    std::vector<std::byte> sbuf = fill(n, 3), rbuf(n);
    auto smr = p->client_backend->register_memory(sbuf.data(), n, MemoryType::host);
    auto rmr = p->server_backend->register_memory(rbuf.data(), n, MemoryType::host);
    ASSERT_TRUE(smr.ok() && rmr.ok());
    auto seq = p->client->post_send({}, smr->span(0, n));
    ASSERT_TRUE(seq.ok());
    std::vector<std::byte> h;
    auto len = p->server->recv_header(h, deadline_in(10s), {});
    ASSERT_TRUE(len.ok()) << len.status().to_string();
    ASSERT_TRUE(p->server->recv_body(rmr->span(0, n), deadline_in(10s), {}).ok());
    ASSERT_TRUE(p->client->wait_sends(*seq, deadline_in(10s), {}).ok());
    EXPECT_EQ(rbuf, sbuf);
  }
}

// Messages sent while the receiver is not reading complete (the receiver stages
// them) and arrive intact and in order when it reads later.
TEST(ucx, LateReaderGetsEverything) {
  if (!have_ucx()) GTEST_SKIP() << "ucx backend not built";
  auto p = make_ucx_pair("tcp");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  const size_t n = size_t(2) << 20;
  std::vector<std::byte> sbuf(n * 4), rbuf(n);
  auto smr = p->client_backend->register_memory(sbuf.data(), sbuf.size(), MemoryType::host);
  auto rmr = p->server_backend->register_memory(rbuf.data(), rbuf.size(), MemoryType::host);
  ASSERT_TRUE(smr.ok() && rmr.ok());
  for (int i = 0; i < 4; ++i) {
    std::memset(sbuf.data() + i * n, i + 1, n);
    std::byte h{uint8_t(i)};
    ASSERT_TRUE(p->client->send({&h, 1}, smr->span(i * n, n), deadline_in(10s), {}).ok()) << i;
  }
  for (int i = 0; i < 4; ++i) {
    std::vector<std::byte> h;
    auto len = p->server->recv_header(h, deadline_in(10s), {});
    ASSERT_TRUE(len.ok()) << len.status().to_string();
    ASSERT_EQ(*len, n);
    ASSERT_EQ(h.size(), 1u);
    EXPECT_EQ(h[0], std::byte(i));
    if (i == 2) {  // a body may also be dropped
      ASSERT_TRUE(p->server->recv_body({}, deadline_in(10s), {}).ok());
      continue;
    }
    ASSERT_TRUE(p->server->recv_body(rmr->span(0, n), deadline_in(10s), {}).ok());
    EXPECT_EQ(rbuf[0], std::byte(i + 1));
    EXPECT_EQ(rbuf[n - 1], std::byte(i + 1));
  }
}

TEST(ucx, RecvBodyDeadlineThenRetry) {
  if (!have_ucx()) GTEST_SKIP() << "ucx backend not built";
  auto p = make_ucx_pair("tcp");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  std::vector<std::byte> h;
  std::vector<std::byte> buf(64);
  auto mr = p->server_backend->register_memory(buf.data(), buf.size(), MemoryType::host);
  ASSERT_TRUE(mr.ok());
  // No body announced yet: a non-empty recv_body is a caller error.
  EXPECT_EQ(p->server->recv_body(mr->span(0, 64), deadline_in(100ms), {}).code(), StatusCode::invalid_argument);
  CancelToken c;
  c.cancel();
  auto r = p->server->recv_header(h, deadline_in(5s), c);
  EXPECT_EQ(r.status().code(), StatusCode::cancelled);
  // The connection still works after a cancelled wait.
  std::vector<std::byte> sb(64, std::byte(5));
  auto smr = p->client_backend->register_memory(sb.data(), sb.size(), MemoryType::host);
  ASSERT_TRUE(smr.ok());
  ASSERT_TRUE(p->client->send({}, smr->span(0, 64), deadline_in(5s), {}).ok());
  auto len = p->server->recv_header(h, deadline_in(5s), {});
  ASSERT_TRUE(len.ok()) << len.status().to_string();
  EXPECT_EQ(*len, 64u);
  EXPECT_TRUE(h.empty());
  ASSERT_TRUE(p->server->recv_body(mr->span(0, 64), deadline_in(5s), {}).ok());
  EXPECT_EQ(buf[63], std::byte(5));
}

#if KVSTREAM_HAVE_UCX
// A peer that breaks the framing, on a connection a listener accepted: corrupt_data,
// and nothing at warn. The peer is kvstream's own UCX engine, used below the
// Connection API, whose framing cannot be broken: after a real handshake it sends a
// header message too short to hold the header's prefix.
TEST(ucx, AMalformedMessageOnAnAcceptedConnectionIsNoWarning) {
  if (!have_ucx()) GTEST_SKIP() << "ucx backend not built";
  const BackendConfig cfg = ucx_config("tcp");
  auto sb = create_backend(cfg);
  ASSERT_TRUE(sb.ok()) << sb.status().to_string();
  auto l = (*sb)->listen("127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  auto accepted = std::async(std::launch::async, [&] { return (*l)->accept(deadline_in(30s), {}); });

  using namespace kvstream::transport::ucx_detail;
  auto eng = Engine::create(cfg);
  ASSERT_TRUE(eng.ok()) << eng.status().to_string();
  auto addrs = resolve_address("ucx", (*l)->address(), false);
  ASSERT_TRUE(addrs.ok()) << addrs.status().to_string();
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addrs->front());
  params.sockaddr.addrlen = sockaddr_len(addrs->front());
  auto cs = begin_establish(**eng, params, (*l)->address(), Side::connected);
  ASSERT_TRUE(cs.ok()) << cs.status().to_string();
  auto client = finish_establish(*eng, *cs, deadline_in(30s), nullptr);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  auto server = accepted.get();
  ASSERT_TRUE(server.ok()) << server.status().to_string();

  const std::array<std::byte, 3> junk{};  // kPrefix is 8 bytes
  Op op;
  {
    std::lock_guard lk((*eng)->mu);
    op.arm();
    ucp_request_param_t p = send_param(op);
    ASSERT_TRUE(op.track(ucp_tag_send_nbx((**cs).ep, junk.data(), junk.size(),
                                          make_tag((**cs).peer_rx_id, kHeaderKind, 0), &p)));
  }
  ASSERT_TRUE((*eng)->wait_quiet([&] { return op.done; }, 10s));
  {
    std::lock_guard lk((*eng)->mu);
    op.release();
  }

  test_util::expect_malformed_without_warning(**server);
}
#endif

}  // namespace

}  // namespace kvstream::test_ucx

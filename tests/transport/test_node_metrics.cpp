// A storage node's metrics: its counters and each namespace's stored bytes and quota
// in the Prometheus text format (storage/node/metrics_text.cpp), served at GET /metrics
// by a listener that a silent, slow or garbage-sending peer cannot stop
// (metrics_listener.cpp), and by kvstream-server --metrics.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <poll.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <fstream>
#include <regex>
#include <sstream>

#include "kvstream/storage.hpp"
#include "storage/node/metrics_listener.hpp"
#include "storage/node/metrics_text.hpp"
#include "tests/support/hang_guard.hpp"
#include "tests/support/node_process.hpp"
#include "tests/transport/tls_test_util.hpp"
#include "tests/transport/free_port.hpp"
#include "tests/transport/metrics_scrape.hpp"
#include "tests/transport/node_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"
#include "tests/transport/ucx_test_util.hpp"
#if KVSTREAM_HAVE_LIBFABRIC
#include "tests/transport/ofi_raw_peer.hpp"
#endif

namespace kvstream::test_node_metrics {

using namespace kvstream::storage;
using namespace kvstream::transport;
using namespace std::chrono_literals;
using transport::test_util::pattern;
namespace node_util = kvstream::storage::node_test_util;
using kvstream::transport::test_util::http_exchange;
using kvstream::transport::test_util::sample;

namespace {

const std::string kSecretA = "0123456789abcdef-tenant-a", kSecretB = "0123456789abcdef-tenant-b";

// http_exchange over TLS 1.3, trusting `ca_file` and checking the certificate names
// 127.0.0.1. Empty when the connection or the handshake failed.
std::string https_exchange(const std::string& address, const std::string& request, const std::string& ca_file) {
  const uint16_t port = uint16_t(std::stoi(address.substr(address.rfind(':') + 1)));
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  if (SSL_CTX_load_verify_locations(ctx.get(), ca_file.c_str(), nullptr) != 1) return {};
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{10, 0};
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in sa{};
  sa.sin_family = AF_INET, sa.sin_port = htons(port), sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) return ::close(fd), std::string();
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), SSL_free);
  SSL_set_fd(ssl.get(), fd);
  X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), "127.0.0.1");
  std::string got;
  if (SSL_connect(ssl.get()) == 1 && SSL_write(ssl.get(), request.data(), int(request.size())) > 0) {
    char buf[4096];
    for (int n; (n = SSL_read(ssl.get(), buf, sizeof buf)) > 0;) got.append(buf, size_t(n));
  }
  ssl.reset();
  ::close(fd);
  return got;
}

class NodeMetrics : public ::testing::Test {
 protected:
  node_util::TempDir tmp_{"kvstream-metrics"};
};

// What a node's counters and usage read as text: a put and a refused put are counted,
// each namespace the node serves is listed with its bytes and quota.
TEST_F(NodeMetrics, CountersAndUsageAsPrometheusText) {
  ServerConfig cfg = node_util::node_config(tmp_.path(), {{"tenant-a", kSecretA}, {"tenant-b", kSecretB}});
  cfg.namespace_quota_bytes = {{"tenant-a", 20000}};  // one 6000-byte chunk and its context, not two
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto a = node_util::connect_client((*server)->address(), "tenant-a", kSecretA);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE((*a)->put("ctx", 0, 0, pattern(6000, 1), deadline_in(10s)).ok());
  EXPECT_EQ((*a)->put("ctx", 1, 0, pattern(6000, 2), deadline_in(10s)).code(), StatusCode::no_space);
  // A mark raised once: the second touch, at the same stamp and depth, raises nothing.
  const ContextTouch t{"ctx", 0};
  ASSERT_TRUE((*a)->touch(std::span(&t, 1), 77, deadline_in(10s)).ok());
  ASSERT_TRUE((*a)->touch(std::span(&t, 1), 77, deadline_in(10s)).ok());
  // A remove of a context the node does not hold is remembered all the same.
  EXPECT_EQ((*a)->remove("gone", deadline_in(10s)).code(), StatusCode::not_found);
  const std::string text = "\n" + metrics_text((*server)->counters(), (*server)->namespace_usage());
  EXPECT_EQ(sample(text, "kvstream_node_quota_refusals_total"), 1);
  EXPECT_EQ(sample(text, "kvstream_node_use_marks_raised_total"), 1);
  EXPECT_EQ(sample(text, "kvstream_node_removes_remembered"), 1);
  EXPECT_EQ(sample(text, "kvstream_node_fenced_gets_total"), 0) << "a node outside a cluster fences nothing";
  EXPECT_EQ(sample(text, "kvstream_node_fenced"), 0) << "a node outside a cluster fences nothing";
  EXPECT_GE(sample(text, "kvstream_node_requests_total"), 3);
  // Both puts' bodies (the refused one is read off the wire too) and the two touches'
  // (12 bytes each: a count, a depth, a length and "ctx").
  EXPECT_EQ(sample(text, "kvstream_node_bytes_in_total"), 12000 + 2 * 12);
  EXPECT_EQ(sample(text, R"(kvstream_node_namespace_stored_bytes{namespace="tenant-a"})"),
            node_util::quota_charge(tmp_.path(), 6000));
  EXPECT_EQ(sample(text, R"(kvstream_node_namespace_quota_bytes{namespace="tenant-a"})"), 20000);
  EXPECT_EQ(sample(text, R"(kvstream_node_namespace_stored_bytes{namespace="tenant-b"})"), 0) << "served, empty";
  EXPECT_EQ(sample(text, R"(kvstream_node_namespace_quota_bytes{namespace="tenant-b"})"), 0);
  EXPECT_EQ(text.find("transport_peer_entries"), std::string::npos) << "a tcp node keeps no per-peer state";
  EXPECT_EQ(text.find("transport_stray"), std::string::npos) << "a tcp node has no strays";
  // Every sample line is "name{labels} value" or "name value", and every name is typed.
  const std::regex line(R"(^(kvstream_node_[a-z_]+)(\{namespace="[^"\\\n]*"\})? [0-9]+$)");
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (l.empty() || l[0] == '#') continue;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, line)) << l;
    EXPECT_NE(text.find("# TYPE " + m[1].str() + " "), std::string::npos) << l;
  }
  // A label value is escaped whatever it holds.
  const std::string odd = metrics_text({}, {{"a\"b\\c\nd", 1, 0}});
  EXPECT_NE(odd.find(R"({namespace="a\"b\\c\nd"} 1)"), std::string::npos) << odd;
}

// Over libfabric a node keeps an entry per client endpoint in its address vector
// while the client is connected, and none after it left: the gauge shows both.
TEST_F(NodeMetrics, ALibfabricNodeShowsThePeersItKeeps) {
  if (!test_util::backend_built("libfabric")) GTEST_SKIP() << "libfabric backend not built";
  auto server = Server::start(node_util::node_config(tmp_.path(), {{"tenant-a", kSecretA}}, "libfabric"));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto peers = [&] { return sample("\n" + metrics_text((*server)->counters(), {}), "kvstream_node_transport_peer_entries"); };
  EXPECT_EQ(peers(), 0);
  {
    auto a = node_util::connect_client((*server)->address(), "tenant-a", kSecretA, "libfabric");
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_TRUE((*a)->put("ctx", 0, 0, pattern(1000, 1), deadline_in(10s)).ok());
    EXPECT_EQ(peers(), 1);
  }
  EXPECT_TRUE(kvstream::testing::eventually([&] { return peers() == 0; })) << peers();
}

#if KVSTREAM_HAVE_UCX
// A UCX node counts the stray messages it drops (transport/ucx/ucx_strays.hpp): a
// peer that made a handshake and never logged in sends 20 of 300 bytes each under rx
// ids no connection uses, and the counters come to 20 and 6000. A tcp node has no
// such counters (above).
TEST_F(NodeMetrics, AUcxNodeCountsTheStraysItDrops) {
  if (!test_util::backend_built("ucx")) GTEST_SKIP() << "ucx backend not built";
  using namespace kvstream::transport::ucx_detail;
  const ServerConfig cfg = node_util::node_config(tmp_.path(), {{"tenant-a", kSecretA}}, "ucx");
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto text = [&] { return "\n" + metrics_text((*server)->counters(), {}); };
  EXPECT_EQ(sample(text(), "kvstream_node_transport_strays_dropped_total"), 0);
  EXPECT_EQ(sample(text(), "kvstream_node_transport_stray_bytes_total"), 0);
  auto peer = test_ucx::connect_raw(cfg.backend, (*server)->address());  // the node's transports
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  const std::vector<std::byte> junk(300, std::byte{0x31});
  for (uint32_t i = 0; i < 20; ++i)
    test_ucx::send_raw(*peer, junk, make_tag((peer->cs->peer_rx_id + 1 + i) & kRxIdMask, kHeaderKind, i));
  EXPECT_TRUE(kvstream::testing::eventually(
      [&] { return sample(text(), "kvstream_node_transport_strays_dropped_total") == 20; }))
      << text();
  EXPECT_EQ(sample(text(), "kvstream_node_transport_stray_bytes_total"), 20 * 300);
}
#endif

#if KVSTREAM_HAVE_LIBFABRIC
// The same over libfabric (transport/ofi/ofi_strays.hpp): a peer that said hello and
// never logged in sends 20 messages of 300 bytes under connection ids other than its
// own, at sequences no connection will reach, and the counters come to 20 and 6000.
TEST_F(NodeMetrics, ALibfabricNodeCountsTheStraysItDrops) {
  if (!test_util::backend_built("libfabric")) GTEST_SKIP() << "libfabric backend not built";
  namespace of = kvstream::transport::ofi;
  const ServerConfig cfg = node_util::node_config(tmp_.path(), {{"tenant-a", kSecretA}}, "libfabric");
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto text = [&] { return "\n" + metrics_text((*server)->counters(), {}); };
  EXPECT_EQ(sample(text(), "kvstream_node_transport_strays_dropped_total"), 0);
  auto peer = test_util::raw_ofi_peer(cfg.backend.libfabric, (*server)->address());
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  std::vector<std::shared_ptr<of::Op>> ops;
  for (uint32_t i = 0; i < 20; ++i) {
    auto op = peer->ep->new_op(300);
    std::memset(op->buf.get(), 0x31, 300);
    auto desc = peer->ep->local_desc(*op);
    ASSERT_TRUE(desc.ok()) << desc.status().to_string();
    const uint32_t id = (peer->greeted.id + 1 + i) & uint32_t(of::Tag::kConnMask);
    ASSERT_TRUE(peer->ep->post_send(op, op->buf.get(), 300, *desc, peer->server,
                                    of::make_tag(of::MsgType::header, id, of::Tag::kSeqMask - i), deadline_in(10s), {})
                    .ok());
    ops.push_back(std::move(op));
  }
  EXPECT_TRUE(kvstream::testing::eventually(
      [&] { return sample(text(), "kvstream_node_transport_strays_dropped_total") == 20; }))
      << text();
  EXPECT_EQ(sample(text(), "kvstream_node_transport_stray_bytes_total"), 20 * 300);
}
#endif

// The listener answers GET /metrics, 404 and 405 otherwise, drops a request too long
// or with no request line, and goes on answering after a peer that sends nothing
// (given 2 s) and one that leaves mid-request.
TEST_F(NodeMetrics, TheEndpointAnswersScrapersAndOutlastsBadPeers) {
  std::atomic<int> calls{0};  // the listener's thread counts, this one reads
  auto m = MetricsListener::start("127.0.0.1:0", [&] { return "kvstream_node_up " + std::to_string(++calls) + "\n"; });
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const std::string addr = (*m)->address();
  std::string got = http_exchange(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("Content-Type: text/plain; version=0.0.4\r\n"), std::string::npos) << got;
  EXPECT_NE(got.find("\r\n\r\nkvstream_node_up 1\n"), std::string::npos) << got;
  EXPECT_EQ(http_exchange(addr, "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(http_exchange(addr, "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(http_exchange(addr, "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(http_exchange(addr, std::string(20000, 'x')), "") << "a request past 8 KiB is dropped unanswered";
  {
    // A peer that connects and sends nothing, and one that leaves mid-request: the
    // next scrape is still answered.
    const int silent = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET, sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(uint16_t(std::stoi(addr.substr(addr.rfind(':') + 1))));
    ASSERT_EQ(::connect(silent, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    (void)http_exchange(addr, "GET /metr");  // sends half a request line and closes... after reading
    got = http_exchange(addr, "GET /metrics HTTP/1.0\r\n\r\n");
    ::close(silent);
  }
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  EXPECT_EQ((*m)->served(), 2u);
  EXPECT_EQ(calls, 2);
  EXPECT_GE((*m)->refused(), 6u);
}

// With a bearer token the tenants' names and usage go only to a scraper that sends
// it: anything else (no header, another scheme, a wrong, short or long token) is
// answered 401 without making the text, and a new token replaces the old one at once.
TEST_F(NodeMetrics, ABearerTokenKeepsTheTenantsFromWhoeverReachesThePort) {
  std::atomic<int> calls{0};
  auto m = MetricsListener::start(
      "127.0.0.1:0", [&] { return "kvstream_node_up " + std::to_string(++calls) + "\n"; }, "s3cret-token");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const std::string addr = (*m)->address();
  auto scrape = [&](const std::string& headers) {
    return http_exchange(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n");
  };
  const std::string refused = scrape("");
  EXPECT_EQ(refused.rfind("HTTP/1.1 401 Unauthorized\r\n", 0), 0u) << refused;
  EXPECT_NE(refused.find("WWW-Authenticate: Bearer"), std::string::npos) << refused;
  for (const char* wrong : {"Authorization: Bearer s3cret-toke\r\n", "Authorization: Bearer s3cret-tokenx\r\n",
                            "Authorization: Bearer S3CRET-TOKEN\r\n", "Authorization: Basic s3cret-token\r\n",
                            "Authorization: s3cret-token\r\n", "X-Authorization: Bearer s3cret-token\r\n"})
    EXPECT_EQ(scrape(wrong).rfind("HTTP/1.1 401", 0), 0u) << wrong;
  EXPECT_EQ(calls, 0) << "the text was made for a request without the token";
  std::string got = scrape("Authorization: Bearer s3cret-token\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("\r\n\r\nkvstream_node_up 1\n"), std::string::npos) << got;
  got = scrape("authorization:   bearer s3cret-token  \r\n");  // header names and the scheme in any case
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  (*m)->set_bearer_token("rotated");
  EXPECT_EQ(scrape("Authorization: Bearer s3cret-token\r\n").rfind("HTTP/1.1 401", 0), 0u);
  EXPECT_EQ(scrape("Authorization: Bearer rotated\r\n").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ((*m)->served(), 3u);
  EXPECT_EQ(calls, 3);
}

// With the node's certificate the endpoint speaks HTTPS only: a scraper that trusts the
// node's authority gets the text (the token checked as over HTTP); plain HTTP, or a
// client that trusts another authority, gets nothing, and the endpoint goes on serving.
TEST_F(NodeMetrics, OverTlsTheTokenAndTheTextCrossEncrypted) {
  const auto& certs = transport::test_util::process_certs();
  ASSERT_TRUE(certs.ok()) << certs.error;
  TlsSettings s;
  s.enabled = true, s.cert_file = certs.server_cert, s.key_file = certs.server_key;
  auto tls = security::TlsContext::create(s, security::TlsRole::server);
  ASSERT_TRUE(tls.ok()) << tls.status().to_string();
  auto m = MetricsListener::start(
      "127.0.0.1:0", [] { return std::string("kvstream_node_up 1\n"); }, "s3cret-token", *tls);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const std::string addr = (*m)->address();
  const std::string get = "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-token\r\n\r\n";
  std::string got = https_exchange(addr, get, certs.ca);
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("\r\n\r\nkvstream_node_up 1\n"), std::string::npos) << got;
  got = https_exchange(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", certs.ca);
  EXPECT_EQ(got.rfind("HTTP/1.1 401", 0), 0u) << got;
  // In clear to the TLS port: no HTTP answer (the handshake fails on it).
  got = http_exchange(addr, get);
  EXPECT_EQ(got.find("HTTP/1.1"), std::string::npos) << got;
  EXPECT_TRUE(https_exchange(addr, get, certs.other_ca).empty()) << "a client of another authority was answered";
  got = https_exchange(addr, get, certs.ca);
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  EXPECT_EQ((*m)->served(), 2u);
  EXPECT_EQ((*m)->refused(), 3u);
  // A client context cannot serve.
  auto client_ctx = security::TlsContext::create(s, security::TlsRole::client);
  ASSERT_TRUE(client_ctx.ok()) << client_ctx.status().to_string();
  EXPECT_EQ(MetricsListener::start("127.0.0.1:0", [] { return std::string(); }, {}, *client_ctx).status().code(),
            StatusCode::invalid_argument);
}

// kvstream-server --metrics-tls: /metrics with the node's certificate, and no start
// without one.
TEST_F(NodeMetrics, KvstreamServerServesThemOverTlsWithItsCertificate) {
  const auto& certs = transport::test_util::process_certs();
  ASSERT_TRUE(certs.ok()) << certs.error;
  const auto secrets = tmp_.path() / "secrets.json";
  std::ofstream(secrets) << R"({"tenant-a": ")" << kSecretA << R"("})";
  const std::string metrics = "127.0.0.1:" + std::to_string(test_util::free_port());
  const std::vector<std::string> args = {"--dir",    (tmp_.path() / "store").string(), "--secrets", secrets.string(),
                                         "--listen", "127.0.0.1:0", "--metrics", metrics, "--metrics-tls"};
  kvstream::testing::NodeProcess node;
  EXPECT_FALSE(node.start(KVSTREAM_SERVER_BIN, args, "warn")) << "--metrics-tls without a certificate started";
  auto with_cert = args;
  with_cert.insert(with_cert.end(), {"--tls-cert", certs.server_cert, "--tls-key", certs.server_key});
  ASSERT_TRUE(node.start(KVSTREAM_SERVER_BIN, with_cert, "warn"));
  const std::string got = https_exchange(metrics, "GET /metrics HTTP/1.1\r\n\r\n", certs.ca);
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("kvstream_node_requests_total"), std::string::npos) << got;
}

// kvstream-server --metrics-token-file: the token is the file's first line, and SIGHUP
// rereads it (a rotation).
TEST_F(NodeMetrics, KvstreamServerAsksForTheTokenOfItsFileAndRereadsItOnSighup) {
  const auto secrets = tmp_.path() / "secrets.json", token = tmp_.path() / "metrics.token";
  std::ofstream(secrets) << R"({"tenant-a": ")" << kSecretA << R"("})";
  std::ofstream(token) << "  first-token \n";
  const std::string metrics = "127.0.0.1:" + std::to_string(test_util::free_port());
  kvstream::testing::NodeProcess node;
  ASSERT_TRUE(node.start(KVSTREAM_SERVER_BIN,
                         {"--dir", (tmp_.path() / "store").string(), "--secrets", secrets.string(), "--listen",
                          "127.0.0.1:0", "--metrics", metrics, "--metrics-token-file", token.string()},
                         "warn"));
  auto status_of = [&](const std::string& t) {
    const std::string got = http_exchange(
        metrics, "GET /metrics HTTP/1.1\r\n" + (t.empty() ? "" : "Authorization: Bearer " + t + "\r\n") + "\r\n");
    return got.substr(0, std::min<size_t>(got.size(), 12));
  };
  EXPECT_EQ(status_of(""), "HTTP/1.1 401");
  EXPECT_EQ(status_of("first-token"), "HTTP/1.1 200");
  std::ofstream(token, std::ios::trunc) << "second-token\n";
  ASSERT_EQ(::kill(node.pid(), SIGHUP), 0);
  EXPECT_TRUE(kvstream::testing::eventually([&] { return status_of("second-token") == "HTTP/1.1 200"; }));
  EXPECT_EQ(status_of("first-token"), "HTTP/1.1 401");
}

// kvstream-server --metrics: a scrape shows the tenant's quota from --namespace-quotas,
// and the raised one after SIGHUP.
TEST_F(NodeMetrics, KvstreamServerServesThemAndTheyFollowSighup) {
  const auto quotas = tmp_.path() / "quotas.json", secrets = tmp_.path() / "secrets.json";
  std::ofstream(secrets) << R"({"tenant-a": ")" << kSecretA << R"("})";
  std::ofstream(quotas) << R"({"tenant-a": 1})";
  const std::string metrics = "127.0.0.1:" + std::to_string(test_util::free_port());
  kvstream::testing::NodeProcess node;
  ASSERT_TRUE(node.start(KVSTREAM_SERVER_BIN,
                         {"--dir", (tmp_.path() / "store").string(), "--secrets", secrets.string(),
                          "--namespace-quotas", quotas.string(), "--listen", "127.0.0.1:0", "--metrics", metrics},
                         "warn"));
  auto a = node_util::connect_client(node.address(), "tenant-a", kSecretA);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE((*a)->put("ctx", 0, 0, pattern(1000, 1), deadline_in(10s)).ok());
  const std::string quota_a = R"(kvstream_node_namespace_quota_bytes{namespace="tenant-a"})";
  std::string got = http_exchange(metrics, "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(sample(got, quota_a), 1 << 20) << got;
  EXPECT_EQ(sample(got, R"(kvstream_node_namespace_stored_bytes{namespace="tenant-a"})"),
            node_util::quota_charge(tmp_.path(), 1000))
      << got;
  std::ofstream(quotas, std::ios::trunc) << R"({"tenant-a": 2})";
  ASSERT_EQ(::kill(node.pid(), SIGHUP), 0);
  EXPECT_TRUE(kvstream::testing::eventually(
      [&] { return sample(http_exchange(metrics, "GET /metrics HTTP/1.1\r\n\r\n"), quota_a) == 2 << 20; }));
}

}  // namespace

}  // namespace kvstream::test_node_metrics

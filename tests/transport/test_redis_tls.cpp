// The Redis storage clients over TLS: redis-server started with TLS only (--port 0,
// a free tls-port) and certificates each test makes (tests/support/test_certs.hpp);
// a Redis Cluster whose nodes talk TLS to each other and to the client. Skipped when
// redis-server (or, for the cluster, redis-cli) is missing or kvstream was built
// without hiredis.
#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <map>

#include "kvstream/redis_storage.hpp"
#include "kvstream/storage.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/test_certs.hpp"
#include "tests/transport/redis_cluster.hpp"
#include "tests/transport/redis_server.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::test_redis_tls {

using namespace kvstream::storage;
using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace tu = kvstream::transport::test_util;
namespace certs = kvstream::testing;
using tu::RedisServer;
using tu::RedisServerTls;

namespace {

class RedisTls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = RedisServer::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    certs_ = certs::make_test_certs(dir_.string());
    ASSERT_TRUE(certs_.ok()) << certs_.error;
  }
  void TearDown() override { server_.reset(); }

  // A redis-server serving TLS only, asking clients for certificates per `auth`.
  RedisServer& start(const std::string& auth = "yes") {
    server_ = std::make_unique<RedisServer>(
        "kvstream-redis-tls", std::vector<std::string>{}, false,
        RedisServerTls{certs_.server_cert, certs_.server_key, certs_.ca, auth, /*clear_port_too=*/false});
    EXPECT_TRUE(server_->started()) << "see " << (server_->dir() / "redis.log");
    return *server_;
  }
  // A client configuration that trusts the test CA and has a client certificate.
  redis::RedisConfig config(const RedisServer& s) const {
    redis::RedisConfig cfg;
    cfg.address = s.tls_address();
    cfg.name_space = "tenant-a";
    cfg.tls.enabled = true;
    cfg.tls.ca_file = certs_.ca;
    cfg.tls.cert_file = certs_.client_cert;
    cfg.tls.key_file = certs_.client_key;
    return cfg;
  }

  kvstream::testing::TempDir dir_{"kvstream-redis-certs"};
  certs::TestCerts certs_;
  std::unique_ptr<RedisServer> server_;
};

// put, get, a range across blocks, stat, list and remove, all through TLS, on an
// address by IP and one by name (each must be in the server's certificate).
TEST_F(RedisTls, RoundTripWithAClientCertificate) {
  auto& s = start("yes");
  ASSERT_TRUE(s.started());
  for (const std::string& address : {s.tls_address(), fmt::format("localhost:{}", s.tls_port())}) {
    auto cfg = config(s);
    cfg.address = address;
    auto c = redis::connect(cfg, deadline_in(10s));
    ASSERT_TRUE(c.ok()) << address << ": " << c.status().to_string();
    const auto big = tu::pattern((1 << 20) + 77, 5), small = tu::pattern(300, 6);
    ASSERT_TRUE((*c)->put("ctx", 0, 0, big, deadline_in(10s)).ok());
    ASSERT_TRUE((*c)->put("ctx", 1, 2, small, deadline_in(10s)).ok());
    std::vector<std::byte> buf(big.size());
    auto mr = (*c)->register_memory(buf.data(), buf.size());
    ASSERT_TRUE(mr.ok());
    auto n = (*c)->get("ctx", 0, 0, *mr, 0, buf.size(), deadline_in(10s));
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    EXPECT_EQ(*n, big.size());
    EXPECT_EQ(buf, big);
    auto r = (*c)->get_range("ctx", 0, 0, 65000, 70000, *mr, 0, deadline_in(10s));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(std::memcmp(buf.data(), big.data() + 65000, 70000), 0);
    auto st = (*c)->stat("ctx", deadline_in(10s));
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    ASSERT_EQ(st->size(), 2u);
    EXPECT_EQ((*st)[1].level_bytes, (std::vector<uint64_t>{0, 0, small.size()}));
    EXPECT_EQ(*(*c)->list(deadline_in(10s)), std::vector<std::string>{"ctx"});
    ASSERT_TRUE((*c)->remove("ctx", deadline_in(10s)).ok());
  }
}

// A client that trusts another CA refuses the server's certificate.
TEST_F(RedisTls, ServerCertificateFromAnotherCaIsRefused) {
  auto& s = start("no");
  ASSERT_TRUE(s.started());
  auto cfg = config(s);
  cfg.tls.ca_file = certs_.other_ca;
  auto c = redis::connect(cfg, deadline_in(10s));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::permission_denied) << c.status().to_string();
  EXPECT_NE(c.status().message().find("certificate"), std::string::npos) << c.status().to_string();
}

// The certificate must name the server asked for: a name it does not carry is refused.
TEST_F(RedisTls, HostnameMismatchIsRefused) {
  auto& s = start("no");
  ASSERT_TRUE(s.started());
  auto cfg = config(s);
  cfg.tls.server_name = "redis.example.com";
  auto c = redis::connect(cfg, deadline_in(10s));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::permission_denied) << c.status().to_string();
  EXPECT_NE(c.status().message().find("hostname mismatch"), std::string::npos) << c.status().to_string();
  cfg.tls.server_name = "localhost";  // the name it does carry, whatever the address
  EXPECT_TRUE(redis::connect(cfg, deadline_in(10s)).ok());
}

// tls-auth-clients yes: no client certificate, or one from a CA the server does not
// trust, is refused with permission_denied.
TEST_F(RedisTls, ServerRequiringClientCertificatesRefusesOthers) {
  auto& s = start("yes");
  ASSERT_TRUE(s.started());
  auto cfg = config(s);
  cfg.tls.cert_file.clear(), cfg.tls.key_file.clear();
  auto none = redis::connect(cfg, deadline_in(10s));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::permission_denied) << none.status().to_string();
  EXPECT_NE(none.status().message().find("client certificate"), std::string::npos) << none.status().to_string();
  cfg.tls.cert_file = certs_.other_client_cert, cfg.tls.key_file = certs_.other_client_key;
  auto other = redis::connect(cfg, deadline_in(10s));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::permission_denied) << other.status().to_string();
}

// A clear client on a TLS port is told so; bad TLS settings are refused before any
// connection.
TEST_F(RedisTls, MisconfigurationsAreNamed) {
  auto& s = start("no");
  ASSERT_TRUE(s.started());
  redis::RedisConfig clear;
  clear.address = s.tls_address();
  auto c = redis::connect(clear, deadline_in(5s));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("RedisConfig::tls"), std::string::npos) << c.status().to_string();
  auto cfg = config(s);
  cfg.tls.ca_file = (dir_ / "missing.pem").string();
  EXPECT_EQ(redis::connect(cfg, deadline_in(5s)).status().code(), StatusCode::invalid_argument);
  cfg = config(s);
  cfg.address = "unix:/tmp/redis.sock";
  EXPECT_EQ(redis::connect(cfg, deadline_in(5s)).status().code(), StatusCode::invalid_argument);
}

// Deadlines hold over TLS: a stalled server ends a get and a connect (the handshake)
// at their deadlines, and the client works again once it is back.
TEST_F(RedisTls, DeadlinesHoldWhenTheServerStalls) {
  auto& s = start("no");
  ASSERT_TRUE(s.started());
  auto cfg = config(s);
  cfg.connections = 1;
  auto c = redis::connect(cfg, deadline_in(10s));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const auto v = tu::pattern(5000, 2);
  ASSERT_TRUE((*c)->put("x", 0, 0, v, deadline_in(5s)).ok());
  std::vector<std::byte> buf(v.size());
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  ::kill(s.pid(), SIGSTOP);
  EXPECT_EQ((*c)->get("x", 0, 0, *mr, 0, buf.size(), deadline_in(300ms)).status().code(), StatusCode::timed_out);
  const auto before = Clock::now();
  auto late = redis::connect(cfg, deadline_in(400ms));
  EXPECT_EQ(late.status().code(), StatusCode::timed_out) << late.status().to_string();
  EXPECT_LT(Clock::now() - before, 5s);
  ::kill(s.pid(), SIGCONT);
  auto r = (*c)->get("x", 0, 0, *mr, 0, buf.size(), deadline_in(8s));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(buf, v);
}

// A Redis Cluster over TLS: the client is given the nodes' TLS ports, learns the rest
// of the topology from CLUSTER SLOTS (TLS ports, as the nodes report them to a TLS
// client), and stores and reads chunks on every shard.
TEST_F(RedisTls, ClusterOverTls) {
  if (auto why = tu::RedisCluster::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  tu::RedisCluster cluster(
      "kvs-rc-tls", 1000, RedisServerTls{certs_.server_cert, certs_.server_key, certs_.ca, "optional", true});
  ASSERT_TRUE(cluster.started()) << cluster.why_not();
  redis::RedisConfig cfg;
  cfg.cluster = true;
  cfg.address = cluster.tls_addresses()[0];  // one seed: the others come from the topology
  cfg.name_space = "tenant-a";
  cfg.put_replicas = 1;
  cfg.tls.enabled = true;
  cfg.tls.ca_file = certs_.ca;
  cfg.tls.cert_file = certs_.client_cert, cfg.tls.key_file = certs_.client_key;
  auto c = redis::connect(cfg, deadline_in(20s));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::map<uint32_t, std::vector<std::byte>> stored;
  for (uint32_t chunk = 0; chunk < 24; ++chunk) {  // 24 hash tags: every shard gets some
    stored[chunk] = tu::pattern(3000 + chunk * 1000, chunk + 1);
    Status ps = (*c)->put("ctx", chunk, 0, stored[chunk], deadline_in(10s));
    ASSERT_TRUE(ps.ok()) << ps.to_string();
  }
  std::vector<std::byte> buf(64 << 10);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  for (const auto& [chunk, want] : stored) {
    auto n = (*c)->get("ctx", chunk, 0, *mr, 0, buf.size(), deadline_in(10s));
    ASSERT_TRUE(n.ok()) << chunk << ": " << n.status().to_string();
    EXPECT_EQ(std::vector<std::byte>(buf.begin(), buf.begin() + long(*n)), want) << chunk;
  }
  auto st = (*c)->stat("ctx", deadline_in(10s));
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->size(), stored.size());
  // Every primary holds some of them: the client reached each over TLS.
  size_t primaries_with_keys = 0;
  for (const auto& n : cluster.nodes())
    if (n.primary &&
        std::atoi(tu::RedisCluster::cli({"-p", std::to_string(n.port), "dbsize"}).c_str()) > 0)
      ++primaries_with_keys;
  EXPECT_EQ(primaries_with_keys, 3u);
  // Slots move between primaries (over TLS): the client's map is stale, and the MOVED
  // replies it follows name TLS ports.
  const auto [from, replica] = cluster.primary_and_replica();
  (void)replica;
  size_t to = 0;
  for (const auto& n : cluster.nodes())
    if (n.primary && n.port != cluster.server(from).port())
      for (size_t i = 0; i < cluster.size(); ++i)
        if (cluster.server(i).port() == n.port) to = i;
  const std::string out = cluster.reshard(from, to, 4000);
  ASSERT_NE(out.find("Moving slot"), std::string::npos) << out;
  for (const auto& [chunk, want] : stored) {
    auto n = (*c)->get("ctx", chunk, 0, *mr, 0, buf.size(), deadline_in(10s));
    ASSERT_TRUE(n.ok()) << chunk << ": " << n.status().to_string();
    EXPECT_EQ(std::vector<std::byte>(buf.begin(), buf.begin() + long(*n)), want) << chunk;
  }
}

}  // namespace

}  // namespace kvstream::test_redis_tls

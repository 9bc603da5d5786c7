// The storage node over TLS with mutual TLS mapped to namespaces
// (ServerConfig::tls_clients), and kvstream-server's refusal to serve clear text off
// loopback unless asked. The whole Storage suite also runs over TLS ("tcp_tls").
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "kvstream/storage.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/transport/tls_test_util.hpp"

namespace kvstream::test_node_tls {

using namespace kvstream::storage;
using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string kSecretB = "secret-of-tenant-b-16+";

class NodeTls : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(test_util::process_certs().ok()) << test_util::process_certs().error;
  }

  // tenant-a: by certificate alone; tenant-b: by secret alone; tenant-c: both.
  ServerConfig server_config() {
    ServerConfig cfg;
    cfg.address = "127.0.0.1:0";
    cfg.backend = test_util::tls_tcp_config();
    cfg.directory = dir_.string();
    cfg.secrets = {{"tenant-b", kSecretB}, {"tenant-c", kSecretB}};
    cfg.tls_clients = {{"tenant-a", {"tenant-a"}}, {"tenant-c", {"tenant-a"}}};
    return cfg;
  }
  enum class Cert { none, ours, foreign };
  Result<std::unique_ptr<Client>> client(const std::string& addr, const std::string& ns, const std::string& secret,
                                         Cert cert) {
    const auto& c = test_util::process_certs();
    ClientConfig cc;
    cc.address = addr;
    cc.backend.tcp.tls.enabled = true;
    cc.backend.tcp.tls.ca_file = c.ca;
    if (cert == Cert::ours) cc.backend.tcp.tls.cert_file = c.client_cert, cc.backend.tcp.tls.key_file = c.client_key;
    if (cert == Cert::foreign)
      cc.backend.tcp.tls.cert_file = c.other_client_cert, cc.backend.tcp.tls.key_file = c.other_client_key;
    cc.name_space = ns;
    cc.secret = secret;
    return Client::connect(cc, deadline_in(30s));
  }
  // A put and a get back through `c`.
  static void round_trip(Client& c) {
    std::vector<std::byte> bytes(100000);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 7);
    ASSERT_TRUE(c.put("ctx", 0, 0, bytes, deadline_in(10s)).ok());
    std::vector<std::byte> buf(bytes.size());
    auto mr = c.register_memory(buf.data(), buf.size());
    ASSERT_TRUE(mr.ok());
    auto n = c.get("ctx", 0, 0, *mr, 0, buf.size(), deadline_in(10s));
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    EXPECT_EQ(buf, bytes);
  }
  kvstream::testing::TempDir dir_{"kvstream-node-tls"};
};

TEST_F(NodeTls, ACertificateAloneLogsIntoItsNamespace) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto c = client((*server)->address(), "tenant-a", "", Cert::ours);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  round_trip(**c);
}

TEST_F(NodeTls, WithoutThatCertificateTheNamespaceIsClosed) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  // No certificate, even knowing another namespace's secret.
  auto none = client((*server)->address(), "tenant-a", kSecretB, Cert::none);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::permission_denied) << none.status().to_string();
  // A certificate with the right name from an authority the node does not trust.
  auto foreign = client((*server)->address(), "tenant-a", "", Cert::foreign);
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), StatusCode::permission_denied) << foreign.status().to_string();
  // A namespace mapped to certificates only is not opened by any secret; one with a
  // secret only still is, with or without a certificate.
  auto by_secret = client((*server)->address(), "tenant-b", kSecretB, Cert::none);
  ASSERT_TRUE(by_secret.ok()) << by_secret.status().to_string();
  round_trip(**by_secret);
  auto wrong_secret = client((*server)->address(), "tenant-b", "not-the-secret-16+", Cert::ours);
  EXPECT_EQ(wrong_secret.status().code(), StatusCode::permission_denied);
}

TEST_F(NodeTls, BothFactorsWhereBothAreConfigured) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  EXPECT_EQ(client((*server)->address(), "tenant-c", kSecretB, Cert::none).status().code(),
            StatusCode::permission_denied);
  EXPECT_EQ(client((*server)->address(), "tenant-c", "not-the-secret-16+", Cert::ours).status().code(),
            StatusCode::permission_denied);
  auto both = client((*server)->address(), "tenant-c", kSecretB, Cert::ours);
  ASSERT_TRUE(both.ok()) << both.status().to_string();
  round_trip(**both);
  EXPECT_GE((*server)->counters().auth_failures, 2u);
}

TEST_F(NodeTls, CertificateNamespacesNeedTls) {
  ServerConfig cfg = server_config();
  cfg.backend = BackendConfig{};
  auto s = Server::start(cfg);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::invalid_argument) << s.status().to_string();
  cfg.backend = test_util::tls_tcp_config();
  cfg.backend.tcp.tls.ca_file.clear();
  EXPECT_EQ(Server::start(cfg).status().code(), StatusCode::invalid_argument);
}

// kvstream-server off loopback: TLS, or --clear-text said out loud.
TEST(NodeClearText, RefusedOffLoopbackUnlessAsked) {
  const kvstream::testing::TempDir dir("kvstream-clear");
  const std::string base = fmt::format(
      "timeout 20 {} --dir {} --listen 0.0.0.0:0 --set storage.namespace=t --set storage.secret=0123456789abcdef-x",
      KVSTREAM_SERVER_BIN, dir.string());
  // Without the flag it exits at once with a message naming the way out.
  FILE* p = ::popen((base + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = ::pclose(p);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--clear-text"), std::string::npos) << out;
}

}  // namespace

}  // namespace kvstream::test_node_tls

// TLS 1.3 on the tcp backend: who is refused (wrong CA, wrong name, no or foreign
// client certificate, a clear-text peer), that a changed byte on the wire is caught,
// and the names a verified client certificate gives the server. The conformance
// suite runs the whole transport contract over TLS as "tcp_tls".
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <thread>

#include "kvstream/transport.hpp"
#include "tests/transport/tls_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::test_tls {

using namespace kvstream::transport;
using namespace std::chrono_literals;

namespace {

using transport::test_util::pattern;
using transport::test_util::process_certs;
using transport::test_util::tls_tcp_config;

struct Ends {
  std::unique_ptr<Backend> server_backend, client_backend;
  std::unique_ptr<Listener> listener;
  Result<std::unique_ptr<Connection>> client = Status(), server = Status();
};

// A backend of `server_cfg` listening on loopback and a backend of `client_cfg`,
// not connected yet; `listener` is null when either could not be made.
Ends listening(const BackendConfig& server_cfg, const BackendConfig& client_cfg) {
  Ends e;
  auto sb = create_backend(server_cfg);
  auto cb = create_backend(client_cfg);
  EXPECT_TRUE(sb.ok() && cb.ok()) << sb.status().to_string() << " " << cb.status().to_string();
  if (!sb.ok() || !cb.ok()) return e;
  e.server_backend = std::move(sb).value(), e.client_backend = std::move(cb).value();
  auto l = e.server_backend->listen("127.0.0.1:0");
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  if (l.ok()) e.listener = std::move(l).value();
  return e;
}

// listening(), then a connect from the client backend (its TLS handshake included)
// and an accept that waits at most `accept_wait`.
Ends connect(const BackendConfig& server_cfg, const BackendConfig& client_cfg,
             std::chrono::milliseconds accept_wait = 10s) {
  Ends e = listening(server_cfg, client_cfg);
  if (!e.listener) return e;
  auto accepted = std::async(std::launch::async, [&] { return e.listener->accept(deadline_in(accept_wait), {}); });
  e.client = e.client_backend->connect(e.listener->address(), deadline_in(10s), {});
  e.server = accepted.get();
  return e;
}

BackendConfig client_trusting(const std::string& ca) {
  BackendConfig cfg;
  cfg.tcp.tls.enabled = true;
  cfg.tcp.tls.ca_file = ca;
  return cfg;
}

TEST(Tls, RoundTripsAndSaysItsPath) {
  ASSERT_TRUE(process_certs().ok()) << process_certs().error;
  auto e = connect(tls_tcp_config(), client_trusting(process_certs().ca));
  ASSERT_TRUE(e.client.ok()) << e.client.status().to_string();
  ASSERT_TRUE(e.server.ok()) << e.server.status().to_string();
  Connection& client = **e.client;
  Connection& server = **e.server;
  for (size_t n : {size_t(0), size_t(1), size_t(16383), size_t(16384), size_t(16385), size_t(1) << 20,
                   (size_t(3) << 20) + 7}) {
    const auto body = pattern(n, uint32_t(n));
    const auto header = pattern(n % 4000 + 1, uint32_t(n) + 1);
    auto sent = std::async(std::launch::async, [&] { return client.send(header, body, deadline_in(20s), {}); });
    std::vector<std::byte> h;
    auto len = server.recv_header(h, deadline_in(20s), {});
    ASSERT_TRUE(len.ok()) << len.status().to_string();
    ASSERT_EQ(*len, n);
    std::vector<std::byte> got(n);
    ASSERT_TRUE(server.recv_body(got, deadline_in(20s), {}).ok());
    ASSERT_TRUE(sent.get().ok());
    EXPECT_EQ(h, header);
    EXPECT_EQ(got, body) << n;
    // And back (the server sends from `h` while the client receives into `h2`).
    auto back = std::async(std::launch::async, [&] { return server.send(h, got, deadline_in(20s), {}); });
    std::vector<std::byte> h2;
    len = client.recv_header(h2, deadline_in(20s), {});
    ASSERT_TRUE(len.ok()) << len.status().to_string();
    EXPECT_EQ(h2, header);
    std::vector<std::byte> again(*len);
    ASSERT_TRUE(client.recv_body(again, deadline_in(20s), {}).ok());
    ASSERT_TRUE(back.get().ok());
    EXPECT_EQ(again, body);
  }
  EXPECT_NE(client.describe().find("TLS 1.3"), std::string::npos) << client.describe();
  EXPECT_NE(server.describe().find("TLS 1.3"), std::string::npos) << server.describe();
  // The client presented no certificate; the server's names localhost.
  EXPECT_TRUE(server.peer_certificate_names().empty());
  const auto names = client.peer_certificate_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "localhost"), names.end());
}

TEST(Tls, ServerOfAnotherAuthorityIsRefused) {
  auto e = connect(tls_tcp_config(), client_trusting(process_certs().other_ca), 1s);
  ASSERT_FALSE(e.client.ok());
  EXPECT_EQ(e.client.status().code(), StatusCode::permission_denied) << e.client.status().to_string();
  EXPECT_NE(e.client.status().message().find("certificate"), std::string::npos) << e.client.status().to_string();
  // Nothing reaches the server's accept.
  EXPECT_EQ(e.server.status().code(), StatusCode::timed_out) << e.server.status().to_string();
}

TEST(Tls, ServerWithAnotherNameIsRefused) {
  BackendConfig c = client_trusting(process_certs().ca);
  c.tcp.tls.server_name = "storage.example";
  auto e = connect(tls_tcp_config(), c, 1s);
  EXPECT_EQ(e.client.status().code(), StatusCode::permission_denied) << e.client.status().to_string();
  EXPECT_EQ(e.server.status().code(), StatusCode::timed_out) << e.server.status().to_string();
}

TEST(Tls, HostnameIsVerifiedByDefault) {
  // The certificate names localhost and 127.0.0.1 (which the other tests connect to).
  auto e = listening(tls_tcp_config(), client_trusting(process_certs().ca));
  ASSERT_TRUE(e.listener);
  auto& l = e.listener;
  auto& cb = e.client_backend;
  const std::string port = l->address().substr(l->address().rfind(':') + 1);
  auto c = cb->connect("localhost:" + port, deadline_in(10s), {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(l->accept(deadline_in(10s), {}).ok());
}

BackendConfig mutual_server() {
  BackendConfig cfg = tls_tcp_config();
  cfg.tcp.tls.require_client_cert = true;
  return cfg;
}

// TLS 1.3: a client finishes its handshake before the server has checked its
// certificate, so a refusal reaches it on its first read (an alert).
void expect_refused_after_connect(Ends& e) {
  EXPECT_EQ(e.server.status().code(), StatusCode::timed_out) << e.server.status().to_string();
  if (!e.client.ok()) {
    EXPECT_EQ(e.client.status().code(), StatusCode::permission_denied) << e.client.status().to_string();
    return;
  }
  std::vector<std::byte> h;
  auto r = (*e.client)->recv_header(h, deadline_in(5s), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::permission_denied) << r.status().to_string();
}

TEST(Tls, MutualTlsRefusesAMissingClientCertificate) {
  auto e = connect(mutual_server(), client_trusting(process_certs().ca), 1s);
  expect_refused_after_connect(e);
}

TEST(Tls, MutualTlsRefusesACertificateOfAnotherAuthority) {
  BackendConfig c = client_trusting(process_certs().ca);
  c.tcp.tls.cert_file = process_certs().other_client_cert;
  c.tcp.tls.key_file = process_certs().other_client_key;
  auto e = connect(mutual_server(), c, 1s);
  expect_refused_after_connect(e);
}

TEST(Tls, MutualTlsGivesTheServerTheClientsNames) {
  BackendConfig c = client_trusting(process_certs().ca);
  c.tcp.tls.cert_file = process_certs().client_cert;
  c.tcp.tls.key_file = process_certs().client_key;
  auto e = connect(mutual_server(), c);
  ASSERT_TRUE(e.client.ok()) << e.client.status().to_string();
  ASSERT_TRUE(e.server.ok()) << e.server.status().to_string();
  const auto names = (*e.server)->peer_certificate_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "tenant-a"), names.end());
}

TEST(Tls, AChangedByteOnTheWireIsCaughtNotDelivered) {
  auto e = listening(tls_tcp_config(), client_trusting(process_certs().ca));
  ASSERT_TRUE(e.listener);
  auto& l = e.listener;
  auto& cb = e.client_backend;
  transport::test_util::TcpProxy proxy(l->address());
  // Far past the handshake: inside the 1 MiB body the server sends.
  proxy.flip_at(300000);
  auto c = cb->connect(proxy.address(), deadline_in(10s), {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto s = l->accept(deadline_in(10s), {});
  ASSERT_TRUE(s.ok());
  const auto body = pattern(size_t(1) << 20, 9);
  const std::byte h[3] = {std::byte(1), std::byte(2), std::byte(3)};
  auto sent = std::async(std::launch::async, [&] { return (*s)->send(h, body, deadline_in(20s), {}); });
  std::vector<std::byte> got_h;
  auto len = (*c)->recv_header(got_h, deadline_in(20s), {});
  ASSERT_TRUE(len.ok()) << len.status().to_string();
  std::vector<std::byte> got(*len);
  Status st = (*c)->recv_body(got, deadline_in(20s), {});
  EXPECT_EQ(st.code(), StatusCode::corrupt_data) << st.to_string();
  EXPECT_NE(st.message().find("authentication"), std::string::npos) << st.to_string();
  (void)sent.get();
  // The connection is closed, not resynchronised past the bad record.
  EXPECT_EQ((*c)->recv_header(got_h, deadline_in(2s), {}).status().code(), StatusCode::unavailable);
}

TEST(Tls, AClearTextPeerIsRefusedEitherWay) {
  // A clear client against a TLS listener: nothing is accepted, the client's read fails.
  {
    auto e = connect(tls_tcp_config(), BackendConfig{}, 1s);
    ASSERT_TRUE(e.client.ok());
    const std::byte h[4] = {};
    (void)(*e.client)->send(h, {}, deadline_in(5s), {});
    EXPECT_EQ(e.server.status().code(), StatusCode::timed_out);
    std::vector<std::byte> got;
    EXPECT_FALSE((*e.client)->recv_header(got, deadline_in(5s), {}).ok());
  }
  // A TLS client against a clear listener: its connect fails.
  {
    auto e = listening(BackendConfig{}, client_trusting(process_certs().ca));
    ASSERT_TRUE(e.listener);
    auto server = std::async(std::launch::async, [&]() -> Status {
      auto s = e.listener->accept(deadline_in(5s), {});
      if (!s.ok()) return s.status();
      std::vector<std::byte> h;
      return (*s)->recv_header(h, deadline_in(5s), {}).status();
    });
    auto c = e.client_backend->connect(e.listener->address(), deadline_in(5s), {});
    EXPECT_FALSE(c.ok());
    EXPECT_EQ(server.get().code(), StatusCode::corrupt_data);
  }
}

// A plain TCP socket connected to the listener at "127.0.0.1:port", or -1.
int connect_raw(const std::string& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(std::stoi(address.substr(address.rfind(':') + 1))));
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

TEST(Tls, ASilentSocketHoldsUpNoOne) {
  auto e = listening(tls_tcp_config(), client_trusting(process_certs().ca));
  ASSERT_TRUE(e.listener);
  auto& l = e.listener;
  auto& cb = e.client_backend;
  // A socket that connects and never speaks.
  const int silent = connect_raw(l->address());
  ASSERT_GE(silent, 0);
  // accept() does not hand it out, and ends by its deadline and by cancel.
  EXPECT_EQ(l->accept(deadline_in(200ms), {}).status().code(), StatusCode::timed_out);
  CancelToken cancel;
  cancel.cancel();
  EXPECT_EQ(l->accept(deadline_in(10s), cancel).status().code(), StatusCode::cancelled);
  // A real client meanwhile connects and is accepted.
  auto c = cb->connect(l->address(), deadline_in(10s), {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(l->accept(deadline_in(10s), {}).ok());
  ::close(silent);
}

// A ClientHello as OpenSSL writes one, taken from memory.
std::string client_hello() {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL* ssl = ctx ? SSL_new(ctx) : nullptr;
  std::string out;
  if (ssl) {
    BIO* wb = BIO_new(BIO_s_mem());
    SSL_set_bio(ssl, BIO_new(BIO_s_mem()), wb);
    SSL_set_connect_state(ssl);
    (void)SSL_do_handshake(ssl);  // wants the server's answer
    char* data = nullptr;
    const long n = BIO_get_mem_data(wb, &data);
    out.assign(data, size_t(std::max(n, 0L)));
    SSL_free(ssl);
  }
  SSL_CTX_free(ctx);
  return out;
}

// Clients that send their ClientHello and leave (close, or reset) before the server
// answers: the listener's handshake writes to a connection that is gone. Through
// OpenSSL's socket BIO (write(2)) that raised SIGPIPE and ended the process: a
// storage node serving TLS died after 6 such clients. Now each is a refused
// handshake, and a real client still gets through.
TEST(Tls, ClientsThatLeaveMidHandshakeRaiseNoSignal) {
  auto e = listening(tls_tcp_config(), client_trusting(process_certs().ca));
  ASSERT_TRUE(e.listener);
  auto& l = e.listener;
  auto& cb = e.client_backend;
  const std::string hello = client_hello();
  ASSERT_GT(hello.size(), 100u);
  std::atomic<bool> done{false};
  std::thread accepting([&] {
    while (!done) (void)l->accept(deadline_in(20ms), {});
  });
  for (int i = 0; i < 200; ++i) {
    const int fd = connect_raw(l->address());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL), ssize_t(hello.size()));
    if (i % 2) {  // a reset instead of an orderly close
      const linger now{1, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof now);
    }
    ::close(fd);
  }
  done = true;
  accepting.join();
  auto accepted = std::async(std::launch::async, [&] { return l->accept(deadline_in(10s), {}); });
  auto c = cb->connect(l->address(), deadline_in(10s), {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto s = accepted.get();
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const std::byte h[2] = {std::byte(7), std::byte(8)};
  ASSERT_TRUE((*c)->send(h, {}, deadline_in(10s), {}).ok());
  std::vector<std::byte> got;
  ASSERT_TRUE((*s)->recv_header(got, deadline_in(10s), {}).ok());
  EXPECT_EQ(got, std::vector<std::byte>(h, h + 2));
}

TEST(Tls, SettingsAreCheckedWhenTheBackendIsMade) {
  BackendConfig cfg;
  ASSERT_TRUE(cfg.set("tcp.tls.enabled=true").ok());
  ASSERT_TRUE(cfg.set("tcp.tls.ca_file=/nonexistent/ca.pem").ok());
  auto b = create_backend(cfg);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::invalid_argument) << b.status().to_string();
  // A server needs its certificate: the listener says so.
  BackendConfig no_cert = client_trusting(process_certs().ca);
  auto nb = create_backend(no_cert);
  ASSERT_TRUE(nb.ok()) << nb.status().to_string();
  auto l = (*nb)->listen("127.0.0.1:0");
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::invalid_argument);
  // A key that is not the certificate's.
  BackendConfig wrong = tls_tcp_config();
  wrong.tcp.tls.key_file = process_certs().client_key;
  auto wb = create_backend(wrong);
  EXPECT_FALSE(wb.ok());
  // TLS asked of a backend that has none is an error, never a clear connection.
  for (const char* other : {"ucx", "libfabric"}) {
    BackendConfig o = tls_tcp_config();
    o.name = other;
    EXPECT_EQ(create_backend(o).status().code(), StatusCode::unsupported) << other;
  }
}

}  // namespace

}  // namespace kvstream::test_tls

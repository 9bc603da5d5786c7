// Test helpers for the UCX backend: its configuration, and a peer built from the
// engine up (RawClient, UcxNode) that can reach its endpoint, its connection state and
// its worker, and send what the Connection API never sends.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <span>
#include <string>
#include <vector>

#include "kvstream/transport.hpp"
#include "tests/transport/transport_test_util.hpp"
#if KVSTREAM_HAVE_UCX
#include "tests/transport/ucx_raw_client.hpp"
#include "transport/ucx/ucx_listener.hpp"
#endif

namespace kvstream::test_ucx {

using namespace kvstream::transport;
using namespace std::chrono_literals;

inline bool have_ucx() {
  for (const auto& b : available_backends())
    if (b == "ucx") return true;
  return false;
}

using UcxPair = test_util::BackendPair;

inline BackendConfig ucx_config(const std::string& tls, bool peer_errors = true) {
  BackendConfig cfg;
  cfg.name = "ucx";
  cfg.ucx.tls = tls;
  cfg.ucx.peer_errors = peer_errors;
  return cfg;
}

inline Result<UcxPair> make_ucx_pair(const std::string& tls, bool peer_errors = true) {
  return test_util::make_backend_pair(ucx_config(tls, peer_errors));
}

inline std::vector<std::byte> fill(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(uint8_t(i * 31 + seed));
  return v;
}

#if KVSTREAM_HAVE_UCX
/// Sends `bytes` under `tag` on the client's endpoint, outside the connection's
/// framing, and waits until UCX is done with the send.
inline void send_raw(RawClient& c, std::span<const std::byte> bytes, uint64_t tag) {
  using namespace kvstream::transport::ucx_detail;
  Op op;
  {
    std::lock_guard lk(c.eng->mu);
    op.arm();
    ucp_request_param_t p = send_param(op);
    ASSERT_TRUE(op.track(ucp_tag_send_nbx(c.cs->ep, bytes.data(), bytes.size(), tag, &p)));
  }
  ASSERT_TRUE(c.eng->wait_quiet([&] { return op.done; }, 10s));
  std::lock_guard lk(c.eng->mu);
  op.release();
  EXPECT_EQ(op.status, UCS_OK) << ucs_status_string(op.status);
}

/// A listener on a ucx engine of its own (a test can reach its worker), and the
/// connections it accepts.
struct UcxNode {
  std::shared_ptr<ucx_detail::Engine> eng;
  std::unique_ptr<Listener> listener;

  static Result<UcxNode> start(const BackendConfig& cfg) {
    UcxNode n;
    KVS_ASSIGN_OR_RETURN(n.eng, ucx_detail::Engine::create(cfg));
    KVS_ASSIGN_OR_RETURN(n.listener, ucx_detail::listen_on(n.eng, "127.0.0.1:0"));
    return n;
  }
  /// Connects a RawClient and returns it with the node's side of its connection.
  Result<std::pair<RawClient, std::unique_ptr<Connection>>> connect(const BackendConfig& cfg, bool keyless = false) {
    auto accepted = std::async(std::launch::async, [&] { return listener->accept(deadline_in(30s), {}); });
    auto client = connect_raw(cfg, listener->address(), keyless);
    auto server = accepted.get();
    KVS_RETURN_IF_ERROR(client.status());
    KVS_RETURN_IF_ERROR(server.status());
    return std::pair{std::move(*client), std::move(*server)};
  }
};

/// One message from `from` to `to` whose header and body arrive as sent.
inline void expect_message(Connection& from, Connection& to, const std::vector<std::byte>& header,
                    const std::vector<std::byte>& body) {
  auto sent = std::async(std::launch::async, [&] { return from.send(header, body, deadline_in(10s), {}); });
  std::vector<std::byte> h;
  auto len = to.recv_header(h, deadline_in(10s), {});
  ASSERT_TRUE(len.ok()) << len.status().to_string();
  EXPECT_EQ(h, header);
  ASSERT_EQ(*len, body.size());
  std::vector<std::byte> b(body.size());
  Status rb = to.recv_body(b, deadline_in(10s), {});
  ASSERT_TRUE(rb.ok()) << rb.to_string();
  EXPECT_EQ(b, body);
  Status sb = sent.get();
  ASSERT_TRUE(sb.ok()) << sb.to_string();
}
#endif

}  // namespace kvstream::test_ucx

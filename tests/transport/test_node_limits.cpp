// The storage node under hostile clients: declared bodies far larger than what they
// send, floods of unauthenticated sockets, sockets that never log in. The node's
// memory stays inside its budget and tenants keep being served.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "kvstream/storage.hpp"
#include "tests/support/hang_guard.hpp"
#include "tests/support/log_capture.hpp"
#include "tests/support/raw_peer.hpp"
#include "tests/transport/node_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"
#include "storage/protocol.hpp"

namespace kvstream::test_node_limits {

using namespace kvstream::storage;
using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using kvstream::testing::RawPeer;

namespace {

const std::string kSecretA = "0123456789abcdef-tenant-a", kSecretB = "0123456789abcdef-tenant-b";

class NodeLimits : public ::testing::Test {
 protected:
  ServerConfig config() {
    return node_test_util::node_config(tmp_.path(), {{"tenant-a", kSecretA}, {"tenant-b", kSecretB}});
  }
  Result<std::unique_ptr<Client>> client(const std::string& addr) {
    return node_test_util::connect_client(addr, "tenant-b", kSecretB);
  }
  node_test_util::TempDir tmp_{"kvstream-limits"};
};

// Puts that declare 1 GiB and send 1 KiB allocate nothing of the declared size: each
// holds one 1 MiB segment from the budget at most, those past the budget are refused
// with an error reply, and a tenant's put is refused cleanly, never with a crash, then
// served once the attackers go.
TEST_F(NodeLimits, DeclaredHugePutsStayInsideTheBudget) {
  auto cfg = config();
  cfg.cache_bytes = 0;
  cfg.memory_budget_bytes = 4 << 20;
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  const std::string addr = (*server)->address();
  std::vector<RawPeer> attackers(6);
  const std::vector<std::byte> kib(1024, std::byte{7});
  for (size_t i = 0; i < attackers.size(); ++i) {
    ASSERT_TRUE(attackers[i].connect(addr));
    ASSERT_TRUE(attackers[i].authenticate("tenant-a", kSecretA));
    Request put;
    put.op = Op::put, put.id = 1, put.context = "big", put.chunk = uint32_t(i);
    put.total = kMaxChunkBytes, put.checksum = 0;
    ASSERT_TRUE(attackers[i].send_message(encode(put), kSegmentBytes, kib));
  }
  EXPECT_TRUE(kvstream::testing::eventually([&] { return (*server)->counters().budget_refusals >= 2; }));
  const auto c = (*server)->counters();
  EXPECT_LE(c.budget_peak_bytes, c.budget_limit_bytes);
  auto tenant = client(addr);
  ASSERT_TRUE(tenant.ok()) << tenant.status().to_string();
  const std::vector<std::byte> body(1000, std::byte{1});
  const Status refused = (*tenant)->put("mine", 0, 0, body, deadline_in(10s));
  EXPECT_EQ(refused.code(), StatusCode::resource_exhausted) << refused.to_string();
  attackers.clear();  // their connections close; their segments come back
  EXPECT_TRUE(kvstream::testing::eventually([&] { return (*tenant)->put("mine", 0, 0, body, deadline_in(10s)).ok(); }));
  EXPECT_LE((*server)->counters().budget_peak_bytes, c.budget_limit_bytes);
}

// A request under an id of no request of its connection (what a transport that let a
// dead connection's message into a new one would deliver, on libfabric possibly from
// another namespace's connection) is not done: the node answers corrupt_data and ends
// the connection. Ids from the connection's window, and from 1 up (clients from
// before the windows), are served.
TEST_F(NodeLimits, ARequestUnderAnotherConnectionsIdIsNotDone) {
  auto server = Server::start(config());
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  const std::string addr = (*server)->address();
  auto tenant = client(addr);
  ASSERT_TRUE(tenant.ok()) << tenant.status().to_string();
  ASSERT_TRUE((*tenant)->put("kept", 0, 0, std::vector<std::byte>(100, std::byte{3}), deadline_in(10s)).ok());
  RawPeer peer;
  ASSERT_TRUE(peer.connect(addr));
  ASSERT_TRUE(peer.authenticate("tenant-b", kSecretB));
  Request stat;
  stat.op = Op::stat, stat.context = "kept";
  for (const uint64_t id : {uint64_t(1), peer.first_id(), peer.first_id() + 12345}) {
    stat.id = id;
    ASSERT_TRUE(peer.send_message(encode(stat), 0, {}));
    auto r = peer.read_response();
    ASSERT_TRUE(r) << id;
    EXPECT_EQ(r->id, id);
    EXPECT_EQ(r->code, StatusCode::ok) << r->message;
  }
  Request remove;
  remove.op = Op::remove, remove.context = "kept";
  remove.id = peer.first_id() + kRequestIdWindow;  // another connection's
  ASSERT_TRUE(peer.send_message(encode(remove), 0, {}));
  auto refused = peer.read_response();
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->code, StatusCode::corrupt_data) << refused->message;
  EXPECT_TRUE(peer.closed_by_peer(5000));
  auto st = (*tenant)->stat("kept", deadline_in(10s));
  EXPECT_TRUE(st.ok()) << "the foreign remove was done: " << st.status().to_string();
}

// Unauthenticated sockets: one source past its limit loses its own oldest; many
// sources fill the pre-auth pool, where the busiest source gives way first; tenants
// log in and are served all the while, from their own slots.
TEST_F(NodeLimits, UnauthenticatedFloodLeavesTenantsServed) {
  auto cfg = config();
  cfg.max_unauthenticated = 16;
  cfg.max_unauthenticated_per_source = 4;
  cfg.auth_timeout = 30s;  // held for the whole test unless evicted
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok());
  const std::string addr = (*server)->address();
  std::vector<RawPeer> one_source(20);
  for (auto& p : one_source) ASSERT_TRUE(p.connect(addr, "127.0.0.2"));
  int closed = 0;
  for (auto& p : one_source) closed += p.closed_by_peer(500) ? 1 : 0;
  EXPECT_EQ(closed, 16) << "a source holds at most 4 unauthenticated connections";
  EXPECT_EQ((*server)->counters().evicted_unauthenticated, 16u);
  std::vector<RawPeer> many_sources(40);
  for (size_t i = 0; i < many_sources.size(); ++i)
    ASSERT_TRUE(many_sources[i].connect(addr, fmt::format("127.0.1.{}", i + 1)));
  // 4 + 40 for 16 places: 28 go, the first four of them 127.0.0.2's.
  EXPECT_TRUE(kvstream::testing::eventually([&] { return (*server)->counters().evicted_unauthenticated >= 16 + 28; }));
  int of_first = 0;
  for (auto& p : one_source) of_first += p.closed_by_peer(50) ? 0 : 1;
  EXPECT_EQ(of_first, 0) << "the busiest source gives way first";
  std::vector<std::unique_ptr<Client>> tenants;
  for (int i = 0; i < 20; ++i) {
    auto t = client(addr);
    ASSERT_TRUE(t.ok()) << "login " << i << ": " << t.status().to_string();
    tenants.push_back(std::move(t).value());
  }
  const std::vector<std::byte> body(5000, std::byte{3});
  for (auto& t : tenants) ASSERT_TRUE(t->put("ctx", 0, 0, body, deadline_in(10s)).ok());
  const auto c = (*server)->counters();
  EXPECT_GE(c.evicted_unauthenticated, 16u + 28u);
}

// A socket that does not authenticate by the deadline is closed; an authenticated one
// that idles for as long is not.
TEST_F(NodeLimits, AuthenticationHasADeadline) {
  auto cfg = config();
  cfg.auth_timeout = 300ms;
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok());
  RawPeer idle, tenant;
  ASSERT_TRUE(idle.connect((*server)->address()));
  ASSERT_TRUE(tenant.connect((*server)->address()));
  ASSERT_TRUE(tenant.authenticate("tenant-a", kSecretA));
  EXPECT_TRUE(idle.closed_by_peer(10000));
  EXPECT_FALSE(tenant.closed_by_peer(600)) << "an authenticated connection is held to idle_timeout";
}

// A storage client whose connections the node closed (a restart here; its idle timeout
// does the same after a minute without requests) connects again on the next call,
// instead of answering every later call with the lost connection's error.
TEST_F(NodeLimits, ANodeRestartedOnItsAddressIsReachedAgainByTheNextCalls) {
  auto cfg = config();
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  cfg.address = (*server)->address();
  auto c = node_test_util::connect_client(cfg.address, "tenant-b", kSecretB, "tcp", /*connections=*/2);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const auto value = test_util::pattern(50000, 7);
  ASSERT_TRUE((*c)->put("ctx", 0, 0, value, deadline_in(10s)).ok());

  (*server)->stop();
  server = Status(StatusCode::unavailable, "stopped");
  // Down: calls fail with a clear error, by their deadline.
  EXPECT_EQ((*c)->stat("ctx", deadline_in(10s)).status().code(), StatusCode::unavailable);

  server = Server::start(cfg);  // the same address and directory
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  // Up again: a call (after the one that may meet the pause between tries) connects,
  // logs in and is served; without reconnecting every call failed from here on.
  int failed = 0;
  ASSERT_TRUE(kvstream::testing::eventually([&] {
    auto st = (*c)->stat("ctx", deadline_in(10s));
    failed += !st.ok();
    return st.ok();
  })) << "the client never reached the restarted node";
  std::vector<std::byte> buf(value.size());
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  ASSERT_TRUE(mr.ok());
  auto n = (*c)->get("ctx", 0, 0, *mr, 0, buf.size(), deadline_in(10s));
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(buf, value);
  // And it keeps working (both its connections were made again).
  for (int i = 0; i < 10; ++i) ASSERT_TRUE((*c)->stat("ctx", deadline_in(10s)).ok()) << i;
}

// Failed logins reach the node's log through its rate limit only: a flood of them is
// one line and a count, not a line each (each failure was also logged where it was
// made: 30 lines for 30 wrong secrets, 10 for 10 requests that were not kvstream's,
// 10 for 10 answers that were not framed).
TEST_F(NodeLimits, FailedLoginsAreLoggedThroughTheRateLimit) {
  auto cfg = config();
  cfg.log_interval = std::chrono::hours(1);  // everything after the first line is held
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok());
  kvstream::testing::LogCapture log;
  for (int i = 0; i < 30; ++i) {
    RawPeer p;
    ASSERT_TRUE(p.connect((*server)->address()));
    EXPECT_FALSE(p.authenticate("tenant-a", "not-the-secret-of-tenant-a"));
  }
  EXPECT_TRUE(kvstream::testing::eventually([&] { return (*server)->counters().auth_failures == 30; }));
  // And 10 that answer the hello with a message that is not a kvstream request.
  for (int i = 0; i < 10; ++i) {
    RawPeer p;
    ASSERT_TRUE(p.connect((*server)->address()));
    ASSERT_TRUE(p.read_response());  // the hello
    ASSERT_TRUE(p.send_message(std::vector<std::byte>(64, std::byte{0x5a}), 0, {}));
    EXPECT_TRUE(p.closed_by_peer(60000));
  }
  // And 10 that answer it with bytes that are not even a frame.
  for (int i = 0; i < 10; ++i) {
    RawPeer p;
    ASSERT_TRUE(p.connect((*server)->address()));
    ASSERT_TRUE(p.read_response());
    const std::vector<std::byte> junk(64, std::byte{0x5a});
    ASSERT_TRUE(p.write_all(junk.data(), junk.size()));
    EXPECT_TRUE(p.closed_by_peer(60000));
  }
  server->reset();  // its threads joined and the count it held back written
  const auto lines = log.warnings();
  const auto count = [&](std::string_view what) {
    return std::count_if(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(what) != l.npos; });
  };
  EXPECT_EQ(count("authentication failed from"), 1) << lines.size() << " lines";
  EXPECT_EQ(count("not a kvstream request"), 0) << lines.size() << " lines";
  EXPECT_EQ(count("bad frame magic"), 0) << lines.size() << " lines";
  EXPECT_EQ(count("storage node login failed: 49 more"), 1) << lines.size() << " lines";
}

}  // namespace

}  // namespace kvstream::test_node_limits

// Who a libfabric listener serves, and what it refuses: a peer's address vector entry
// goes with its last connection (and an shm node outlives its vector's 256 entries), a
// malformed message, another peer's message under a connection's id, junk under the
// hello tag, hellos from peers that cannot be reached; and shm endpoints within one process (ofi_shm_local.hpp): a name this
// process closed, a peer here that goes. The fixture and its instantiation are
// test_ofi.cpp's (ofi_test_util.hpp).
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <future>
#include <thread>

#include "tests/support/hang_guard.hpp"
#include "tests/transport/free_port.hpp"
#include "tests/transport/ofi_test_util.hpp"
#if KVSTREAM_HAVE_LIBFABRIC
#include "tests/transport/ofi_raw_peer.hpp"
#include "transport/ofi/ofi_shm_local.hpp"
#endif

namespace kvstream::test_ofi_peers {

using namespace kvstream::test_ofi;

namespace {

#if KVSTREAM_HAVE_LIBFABRIC
/// Sends one small message from `from` to `to` and checks it arrived whole.
void one_message(Connection& from, Connection& to, uint8_t mark) {
  const std::byte h[3] = {std::byte('m'), std::byte(mark), std::byte('!')};
  auto seq = from.post_send(h, {});
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  std::vector<std::byte> got;
  auto len = to.recv_header(got, deadline_in(10s), {});
  ASSERT_TRUE(len.ok()) << len.status().to_string();
  ASSERT_TRUE(to.recv_body({}, deadline_in(10s), {}).ok());
  EXPECT_EQ(got, std::vector<std::byte>(h, h + 3));
  EXPECT_TRUE(from.wait_sends(*seq, deadline_in(10s), {}).ok());
}

// Every hello used to insert its sender's address into the listener's address vector
// for good, and a second connection from one client endpoint inserted it again (a
// duplicate libfabric leaves undefined): a node kept an entry, and over ofi_rxm a peer
// record, for every client endpoint it ever served. Now a peer is one entry that its
// connections share, it leaves the vector with the last of them, and a client that
// comes back is inserted again and served.
TEST_P(LibfabricProvider, APeersAddressLeavesTheListenersVectorWithItsLastConnection) {
  auto sb = create_backend(ofi_config(GetParam()));
  auto cb = create_backend(ofi_config(GetParam()));
  ASSERT_TRUE(sb.ok() && cb.ok());
  auto l = (*sb)->listen("127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  auto peers = [&] { return (*l)->peer_entries().value(); };
  EXPECT_EQ(peers(), 0u);
  std::unique_ptr<Connection> c1, s1, c2, s2;
  ASSERT_NO_FATAL_FAILURE(connect_through(**l, **cb, c1, s1));
  ASSERT_NO_FATAL_FAILURE(connect_through(**l, **cb, c2, s2));
  ASSERT_NO_FATAL_FAILURE(one_message(*c1, *s1, 1));
  ASSERT_NO_FATAL_FAILURE(one_message(*s2, *c2, 2));
  // One entry where the client backend shares an endpoint between its connections
  // (tcp;ofi_rxm), one per connection where each has its own.
  const size_t endpoints = peers();
  EXPECT_TRUE(endpoints == 1 || endpoints == 2) << endpoints;
  c1.reset(), s1.reset();
  EXPECT_TRUE(kvstream::testing::eventually([&] { return peers() == 1; })) << peers() << " entries with one connection left";
  ASSERT_NO_FATAL_FAILURE(one_message(*c2, *s2, 3));  // the connection left is untouched
  c2.reset(), s2.reset();
  EXPECT_TRUE(kvstream::testing::eventually([&] { return peers() == 0; })) << peers() << " entries with no connection left";
  // The same client backend again: its address is inserted anew and served.
  ASSERT_NO_FATAL_FAILURE(connect_through(**l, **cb, c1, s1));
  ASSERT_NO_FATAL_FAILURE(one_message(*c1, *s1, 4));
  ASSERT_NO_FATAL_FAILURE(one_message(*s1, *c1, 5));
  EXPECT_EQ(peers(), 1u);
  c1.reset(), s1.reset();
  EXPECT_TRUE(kvstream::testing::eventually([&] { return peers() == 0; })) << peers();
}

// A peer that breaks the framing, on a connection a listener accepted: corrupt_data,
// and nothing at warn. The peer is kvstream's own endpoint, used below the Connection
// API: after a real hello it sends a header message too short to hold the header's
// prefix.
TEST_P(LibfabricProvider, AMalformedMessageOnAnAcceptedConnectionIsNoWarning) {
  auto sb = create_backend(ofi_config(GetParam()));
  ASSERT_TRUE(sb.ok()) << sb.status().to_string();
  auto l = (*sb)->listen("127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  auto accepted = std::async(std::launch::async, [&] { return (*l)->accept(deadline_in(30s), {}); });

  auto peer = test_util::raw_ofi_peer(ofi_config(GetParam()).libfabric, (*l)->address());
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  auto& ep = peer->ep;
  auto server = accepted.get();
  ASSERT_TRUE(server.ok()) << server.status().to_string();

  auto op = ep->new_op(3);  // a header prefix is 16 bytes
  auto desc = ep->local_desc(*op);
  ASSERT_TRUE(desc.ok()) << desc.status().to_string();
  ASSERT_TRUE(ep->post_send(op, op->buf.get(), 3, *desc, peer->server,
                            ofi::make_tag(ofi::MsgType::header, peer->greeted.id), deadline_in(30s), {})
                  .ok());
  ASSERT_TRUE(ep->wait([&] { return op->done.load(); }, deadline_in(30s), nullptr, "junk send").ok());

  test_util::expect_malformed_without_warning(**server);
}

/// Sends a header message ("prefix + `header`", no body) from a raw peer under
/// connection `id`'s tag for sequence number `seq`, and waits for the send to complete.
void send_raw_header(test_util::RawOfiPeer& peer, uint32_t id, uint64_t seq, const std::string& header) {
  ofi::HeaderPrefix prefix{ofi::kHeaderMagic, uint32_t(header.size()), 0};
  auto op = peer.ep->new_op(sizeof prefix + header.size());
  std::memcpy(op->buf.get(), &prefix, sizeof prefix);
  std::memcpy(op->buf.get() + sizeof prefix, header.data(), header.size());
  auto desc = peer.ep->local_desc(*op);
  ASSERT_TRUE(desc.ok()) << desc.status().to_string();
  ASSERT_TRUE(peer.ep->post_send(op, op->buf.get(), sizeof prefix + header.size(), *desc, peer.server,
                                 ofi::make_tag(ofi::MsgType::header, id, seq), deadline_in(30s), {})
                  .ok());
  ASSERT_TRUE(peer.ep->wait([&] { return op->done.load(); }, deadline_in(30s), nullptr, "raw header").ok());
}

// shm's address vector holds 256 peers (libfabric 1.17). While every client endpoint
// that ever connected kept its entry, a node over shm stopped accepting for good at
// its 255th client: fi_av_insert failed, and each later connect timed out.
TEST(libfabric, AnShmNodeServesMoreClientsOverItsLifeThanItsVectorHolds) {
  auto sb = create_backend(ofi_config("shm"));
  if (!sb.ok()) GTEST_SKIP() << "shm: " << sb.status().to_string();
  auto l = (*sb)->listen("127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  for (int i = 0; i < 300; ++i) {
    SCOPED_TRACE(::testing::Message() << "client " << i);
    auto cb = create_backend(ofi_config("shm"));  // a new endpoint, as a new client process has
    ASSERT_TRUE(cb.ok()) << cb.status().to_string();
    std::unique_ptr<Connection> c, s;
    ASSERT_NO_FATAL_FAILURE(connect_through(**l, **cb, c, s));
    ASSERT_NO_FATAL_FAILURE(one_message(*c, *s, uint8_t(i)));
    c.reset(), s.reset();
  }
  EXPECT_TRUE(kvstream::testing::eventually([&] { return (*l)->peer_entries().value() == 0; }));
}

// A peer that said hello can send under any connection id of the listener's endpoint
// (the ids are small and handed out in order). An accepted connection took its
// messages from anyone, so such a peer could put a request into another client's
// logged-in connection, in that client's namespace. It now takes them from its own
// client only, where the provider directs receives to a source (tcp;ofi_rxm).
TEST_P(LibfabricProvider, AConnectionTakesNoMessageUnderItsIdFromAnotherPeer) {
  auto sb = create_backend(ofi_config(GetParam()));
  ASSERT_TRUE(sb.ok()) << sb.status().to_string();
  auto l = (*sb)->listen("127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  auto accept_one = [&] { return std::async(std::launch::async, [&] { return (*l)->accept(deadline_in(30s), {}); }); };
  auto pending = accept_one();
  auto victim = test_util::raw_ofi_peer(ofi_config(GetParam()).libfabric, (*l)->address());
  ASSERT_TRUE(victim.ok()) << victim.status().to_string();
  auto conn = pending.get();
  ASSERT_TRUE(conn.ok()) << conn.status().to_string();
  pending = accept_one();
  auto intruder = test_util::raw_ofi_peer(ofi_config(GetParam()).libfabric, (*l)->address());
  ASSERT_TRUE(intruder.ok()) << intruder.status().to_string();
  auto other = pending.get();
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  if (!ofi::open_core(ofi_config(GetParam()).libfabric, false).value()->directed_recv)
    GTEST_SKIP() << GetParam() << " does not direct receives to a source: any local process can write under an id";

  send_raw_header(*intruder, victim->greeted.id, 0, "forged");
  std::vector<std::byte> header;
  auto got = (*conn)->recv_header(header, deadline_in(1s), {});
  EXPECT_FALSE(got.ok()) << "took another peer's message: "
                         << std::string(reinterpret_cast<const char*>(header.data()), header.size());
  send_raw_header(*victim, victim->greeted.id, 0, "genuine");
  got = (*conn)->recv_header(header, deadline_in(10s), {});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(header.data()), header.size()), "genuine");
  ASSERT_TRUE((*conn)->recv_body({}, deadline_in(10s), {}).ok());
  conn->reset(), other->reset();  // their bye goes to endpoints still open
}

// Messages under the hello's tag that are no hello (a wrong magic, too short) use up
// the listener's posted hello receives. They were replaced only after a valid hello
// was taken, so twice the pool of junk left none posted and the listener never
// accepted again (the second hello below waited out its 10 s).
TEST_P(LibfabricProvider, JunkUnderTheHelloTagDoesNotStopTheListener) {
  auto node = test_util::AcceptingListener::start(ofi_config(GetParam()));
  ASSERT_TRUE(node.ok()) << node.status().to_string();
  auto peer = (*node)->raw_peer();
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  auto& ep = (*peer)->ep;
  for (int i = 0; i < 24; ++i) {
    ofi::Hello junk{};
    junk.magic = i % 2 ? 0x12345678 : 0;
    const size_t len = i % 3 ? sizeof junk : 4;  // some too short to hold a hello
    auto op = ep->new_op(sizeof junk);
    std::memcpy(op->buf.get(), &junk, sizeof junk);
    auto desc = ep->local_desc(*op);
    ASSERT_TRUE(desc.ok()) << desc.status().to_string();
    ASSERT_TRUE(ep->post_send(op, op->buf.get(), len, *desc, (*peer)->server, ofi::make_tag(ofi::MsgType::hello, 0),
                              deadline_in(30s), {})
                    .ok());
    ASSERT_TRUE(ep->wait([&] { return op->done.load(); }, deadline_in(30s), nullptr, "junk send").ok());
  }
  // From the same endpoint, so it arrives after the junk.
  auto again = ofi::say_hello(*ep, (*peer)->server, (*node)->address(), deadline_in(10s), {});
  EXPECT_TRUE(again.ok()) << again.status().to_string();
  auto fresh = create_backend(ofi_config(GetParam()));
  ASSERT_TRUE(fresh.ok()) << fresh.status().to_string();
  auto c = (*fresh)->connect((*node)->address(), deadline_in(10s), {});
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (c.ok()) c->reset();  // closed (its bye sent) before the listener's side goes
  (*node)->stop();
  EXPECT_EQ((*node)->accepted(), 3);
}

// Hellos whose senders cannot be reached (here: addresses where nothing listens; in
// the crash checker on a loaded host, clients whose connect had timed out and whose
// endpoints were gone) are stepped beside the others: a client that comes after them
// connects at once. Before, the listener worked on one handshake at a time, and the
// provider refused each such ack (EAGAIN, over ofi_rxm a connect that fails and is
// tried again) until kHandshakeLimit: three of them held a client back for 30 s.
TEST_P(LibfabricProvider, HellosFromPeersThatCannotBeReachedHoldUpNoOtherClient) {
  auto node = test_util::AcceptingListener::start(ofi_config(GetParam()));
  ASSERT_TRUE(node.ok()) << node.status().to_string();
  auto peer = (*node)->raw_peer();
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  if (!(*peer)->core->sockaddr_names()) GTEST_SKIP() << GetParam() << " names are no socket addresses";
  for (uint32_t i = 0; i < 3; ++i) {
    const Status sent = test_util::send_hello_from_nowhere(**peer, ofi::kHelloMagic, 0x6000 + i, 0);
    ASSERT_TRUE(sent.ok()) << sent.to_string();
  }
  auto fresh = create_backend(ofi_config(GetParam()));
  ASSERT_TRUE(fresh.ok()) << fresh.status().to_string();
  auto c = (*fresh)->connect((*node)->address(), deadline_in(8s), {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  c->reset();  // closed (its bye sent) before the listener's side goes
  (*node)->stop();
  EXPECT_EQ((*node)->accepted(), 2) << "the raw peer and the client; none of the unreachable";
}
#endif

// An shm endpoint's region is a file under /dev/shm named after it, and a process
// that dies leaves it there: libfabric 1.17 then fails every endpoint of that name
// (fi_enable: EBUSY). A listener on a port of the user's choosing says so and names
// the file; one on port 0 passes over ports whose file exists (before, it failed with
// EBUSY where the kernel handed it such a port: the shm tests failed now and then on a
// host where earlier runs had left files).
TEST(libfabric, AnShmNameTakenOnTheHostIsSaidOrPassedOver) {
  if (!have_libfabric()) GTEST_SKIP() << "libfabric backend not built";
  auto server = create_backend(ofi_config("shm"));
  if (!server.ok()) GTEST_SKIP() << "provider shm not available: " << server.status().to_string();
  const uint16_t port = test_util::free_port();
  const std::string name = fmt::format("127.0.0.1:{}", port), file = "/dev/shm/" + name;
  {
    std::ofstream left(file);  // what a dead process's region leaves
    left << "stale";
  }
  ASSERT_TRUE(ofi::shm_name_on_host("fi_ns://" + name));
  auto taken = (*server)->listen(name);
  std::filesystem::remove(file);
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.status().code(), StatusCode::unavailable);
  EXPECT_NE(taken.status().message().find("taken on this host (" + file), std::string::npos)
      << taken.status().to_string();
  EXPECT_FALSE(ofi::shm_name_on_host("fi_ns://" + name));
  auto freed = (*server)->listen(name);
  ASSERT_TRUE(freed.ok()) << freed.status().to_string();
  EXPECT_TRUE(ofi::shm_name_on_host("fi_ns://" + name)) << "a live listener's region";
  auto other = (*server)->listen("127.0.0.1:0");
  ASSERT_TRUE(other.ok()) << other.status().to_string();
}

// libfabric's shm keeps the name and memory of every endpoint a process opened in a
// process-wide list and leaves them there when the endpoint closes (ofi_shm_local.hpp).
// A listener opened again on a port an earlier listener of this process had took the
// earlier one's name; an insert of that name used the earlier endpoint's unmapped
// memory, or whatever was mapped there since: here a listener opened in between, so
// the client's hello went to that listener's queues (the connect timed out), or
// SIGSEGV. The name is refused instead.
TEST(libfabric, AnShmNameThisProcessClosedIsRefusedNotReachedThroughOldMemory) {
  if (!have_libfabric()) GTEST_SKIP() << "libfabric backend not built";
  auto server = create_backend(ofi_config("shm"));
  if (!server.ok()) GTEST_SKIP() << "provider shm not available: " << server.status().to_string();
  auto client = create_backend(ofi_config("shm"));
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  std::string address;
  {
    auto first = (*server)->listen("127.0.0.1:0");
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    address = (*first)->address();
  }
  auto between = (*server)->listen("127.0.0.1:0");  // may be mapped where the first one was
  ASSERT_TRUE(between.ok()) << between.status().to_string();
  EXPECT_NE((*between)->address(), address) << "a listener on any port takes no closed name";
  auto again = (*server)->listen(address);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  auto acc = std::async(std::launch::async, [&] { return (*again)->accept(deadline_in(1s), {}); });
  auto c = (*client)->connect(address, deadline_in(3s), {});
  ASSERT_FALSE(c.ok()) << "connected to a name whose old memory the provider still uses";
  EXPECT_EQ(c.status().code(), StatusCode::unavailable) << c.status().to_string();
  EXPECT_NE(c.status().message().find("was closed in this process"), std::string::npos) << c.status().to_string();
  EXPECT_FALSE(acc.get().ok());
  // The listener in between is untouched: a client reaches it.
  auto acc2 = std::async(std::launch::async, [&] { return (*between)->accept(deadline_in(10s), {}); });
  auto c2 = (*client)->connect((*between)->address(), deadline_in(10s), {});
  ASSERT_TRUE(c2.ok()) << c2.status().to_string();
  auto s2 = acc2.get();
  ASSERT_TRUE(s2.ok()) << s2.status().to_string();
  const std::vector<std::byte> hello = fill(40, 9);
  ASSERT_TRUE((*c2)->send(hello, {}, deadline_in(10s), {}).ok());
  std::vector<std::byte> got;
  ASSERT_TRUE((*s2)->recv_header(got, deadline_in(10s), {}).ok());
  EXPECT_EQ(got, hello);
}

#if KVSTREAM_HAVE_LIBFABRIC
// A peer in this process whose shm endpoint closes while another endpoint here still
// has it in its address vector (ofi_shm_local.hpp): a client sending while the node in
// its process goes, and a node sending while its client goes. Each send wrote into the
// closed endpoint's unmapped memory: SIGSEGV in the first round. The closing endpoint
// is parked instead until the last endpoint holding it lets go, then closed.
TEST(libfabric, AnShmPeerInThisProcessThatGoesIsNoCrash) {
  if (!have_libfabric()) GTEST_SKIP() << "libfabric backend not built";
  if (!create_backend(ofi_config("shm")).ok()) GTEST_SKIP() << "provider shm not available";
  const std::vector<std::byte> h = fill(32, 1);
  // Sends on `c` until one fails (the peer gone: its bye, its full queue) or 20 s.
  const auto send_until_it_fails = [&](Connection& c, std::atomic<int>& sent) {
    for (const auto until = Clock::now() + 20s; Clock::now() < until; ++sent)
      if (!c.send(h, {}, deadline_in(200ms), {}).ok()) return true;
    return false;
  };
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    auto p = make_ofi_pair("shm");
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    const bool node_goes = round % 2 == 0;
    Connection& sender = node_goes ? *p->client : *p->server;
    std::atomic<int> sent{0};
    auto failed = std::async(std::launch::async, [&] { return send_until_it_fails(sender, sent); });
    while (sent.load() < 10 * (round + 1)) std::this_thread::yield();  // sends under way
    if (node_goes) {
      p->server.reset(), p->listener.reset(), p->server_backend.reset();
    } else {
      p->client.reset(), p->client_backend.reset();
    }
    EXPECT_TRUE(failed.get()) << "sends to a peer that went kept succeeding";
    p->server.reset(), p->client.reset(), p->listener.reset();
    p->server_backend.reset(), p->client_backend.reset();
    EXPECT_EQ(ofi::shm_endpoints_parked(), 0u) << "a parked endpoint outlived every endpoint holding it";
  }
}
#endif

}  // namespace

}  // namespace kvstream::test_ofi_peers

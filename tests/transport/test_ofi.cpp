// libfabric-specific tests (the shared contract is in test_conformance.cpp): each
// provider we expect on a single machine, cuda refusal, connections sharing one
// listener endpoint, the "bye" on orderly close, many large messages in order, one-sided
// reads. Who a listener serves and what it refuses: test_ofi_peers.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <thread>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/transport/ofi_test_util.hpp"

namespace kvstream::test_ofi {

namespace {

/// Messages of every size from 0 bytes to 3 MiB, client to server and back (the body
/// discarded on the client); each receiving side runs on its own thread while the
/// sender waits, as a client and a node do. Fatal failures end the calling test.
void round_trip_every_size(OfiPair& pair) {
  OfiPair* p = &pair;
  const size_t max = size_t(3) << 20;
  std::vector<std::byte> sbuf(max), rbuf(max);
  auto smr = p->client_backend->register_memory(sbuf.data(), max, MemoryType::host);
  auto rmr = p->server_backend->register_memory(rbuf.data(), max, MemoryType::host);
  ASSERT_TRUE(smr.ok() && rmr.ok());
  for (size_t n : {size_t(0), size_t(1), size_t(63), size_t(4097), size_t(200000), max}) {
    SCOPED_TRACE(::testing::Message() << "body of " << n << " bytes");
    auto body = fill(n, uint8_t(n));
    if (n) std::memcpy(sbuf.data(), body.data(), n);
    auto header = fill(16 + n % 100, 3);
    // Sends are zero copy: a large body completes only once the peer reads it, and a
    // provider that pushes back (EAGAIN) gets the rest of a message only while its
    // sender is in a send or receive call on that connection (post_send's contract):
    // the receiver runs on its own thread while the sender waits, as a client and a
    // node do.
    auto seq = p->client->post_send(header, smr->span(0, n));
    ASSERT_TRUE(seq.ok()) << seq.status().to_string();
    std::vector<std::byte> h;
    std::memset(rbuf.data(), 0, n);
    auto rx = std::async(std::launch::async, [&]() -> Result<size_t> {
      auto len = p->server->recv_header(h, deadline_in(10s), {});
      if (len.ok()) KVS_RETURN_IF_ERROR(p->server->recv_body(rmr->span(0, *len), deadline_in(10s), {}));
      return len;
    });
    ASSERT_TRUE(p->client->wait_sends(*seq, deadline_in(10s), {}).ok());
    auto len = rx.get();
    ASSERT_TRUE(len.ok()) << len.status().to_string();
    ASSERT_EQ(*len, n);
    EXPECT_EQ(h, header);
    if (n) EXPECT_EQ(std::memcmp(rbuf.data(), body.data(), n), 0) << n;
    // And back, with the body discarded on the client.
    seq = p->server->post_send(header, rmr->span(0, n));
    ASSERT_TRUE(seq.ok()) << seq.status().to_string();
    auto back = std::async(std::launch::async, [&]() -> Result<size_t> {
      auto got = p->client->recv_header(h, deadline_in(10s), {});
      if (got.ok()) KVS_RETURN_IF_ERROR(p->client->recv_body({}, deadline_in(10s), {}));
      return got;
    });
    ASSERT_TRUE(p->server->wait_sends(*seq, deadline_in(10s), {}).ok());
    len = back.get();
    ASSERT_TRUE(len.ok()) << len.status().to_string();
    ASSERT_EQ(*len, n);
  }
}


TEST_P(LibfabricProvider, DeclaresProviderAndRoundTrips) {
  auto p = make_ofi_pair(GetParam());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  const Capabilities& caps = p->client_backend->capabilities();
  EXPECT_EQ(caps.backend, "libfabric");
  EXPECT_EQ(caps.provider, GetParam());
  EXPECT_GE(caps.max_message_bytes, uint64_t(1) << 30);
  EXPECT_FALSE(caps.cuda_memory);
  const std::string d = p->client->describe();
  EXPECT_EQ(d, "libfabric " + p->listener->address() + " (" + GetParam() + ")");
  EXPECT_EQ(p->server->describe().rfind("libfabric ", 0), 0u) << p->server->describe();

  round_trip_every_size(*p);
}

TEST_P(LibfabricProvider, TwoConnectionsToOneListenerDoNotMix) {
  auto sb = create_backend(ofi_config(GetParam()));
  auto cb = create_backend(ofi_config(GetParam()));
  ASSERT_TRUE(sb.ok() && cb.ok());
  auto l = (*sb)->listen("127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  std::unique_ptr<Connection> clients[2], servers[2];
  for (int i = 0; i < 2; ++i) ASSERT_NO_FATAL_FAILURE(connect_through(**l, **cb, clients[i], servers[i]));
  const size_t n = 300000;
  std::vector<std::byte> buf(4 * n);
  auto mr = (*cb)->register_memory(buf.data(), 2 * n, MemoryType::host);
  auto rmr = (*sb)->register_memory(buf.data() + 2 * n, 2 * n, MemoryType::host);
  ASSERT_TRUE(mr.ok() && rmr.ok());
  std::memset(buf.data(), 0xA0, n);
  std::memset(buf.data() + n, 0xB1, n);
  // Interleave: connection 1 first, then 0, several messages each (posted: they
  // complete as the server reads them).
  uint64_t last[2] = {0, 0};
  for (int k = 0; k < 5; ++k)
    for (int i : {1, 0}) {
      std::byte h[2] = {std::byte(i), std::byte(k)};
      auto seq = clients[i]->post_send(h, mr->span(size_t(i) * n, n - k));
      ASSERT_TRUE(seq.ok()) << seq.status().to_string();
      last[i] = *seq;
    }
  for (int i : {0, 1})
    for (int k = 0; k < 5; ++k) {
      std::vector<std::byte> h;
      auto len = servers[i]->recv_header(h, deadline_in(10s), {});
      ASSERT_TRUE(len.ok()) << len.status().to_string();
      ASSERT_EQ(h.size(), 2u);
      EXPECT_EQ(int(h[0]), i);
      EXPECT_EQ(int(h[1]), k);
      ASSERT_EQ(*len, n - k);
      ASSERT_TRUE(servers[i]->recv_body(rmr->span(0, *len), deadline_in(10s), {}).ok());
      const std::byte want = std::byte(i ? 0xB1 : 0xA0);
      EXPECT_TRUE(std::all_of(buf.data() + 2 * n, buf.data() + 2 * n + *len, [&](std::byte b) { return b == want; }));
    }
  for (int i : {0, 1}) EXPECT_TRUE(clients[i]->wait_sends(last[i], deadline_in(10s), {}).ok());
}

// One client backend connected to two listeners: each numbers its connections from
// 1, so the client's two connections carry the same id in their tags. On tcp;ofi_rxm
// they share the client's endpoint (one set of the provider's buffers), and each
// receive names its peer: a message from the second listener must not land in a
// receive the first connection has posted. That receive is left posted by a
// recv_header that timed out (it stays posted: no message is lost).
TEST_P(LibfabricProvider, ConnectionsToTwoListenersDoNotTakeEachOthersMessages) {
  std::unique_ptr<Backend> servers_b[2];
  std::unique_ptr<Listener> listeners[2];
  std::unique_ptr<Connection> clients[2], servers[2];
  auto cb = create_backend(ofi_config(GetParam()));
  ASSERT_TRUE(cb.ok()) << cb.status().to_string();
  for (int i = 0; i < 2; ++i) {
    auto sb = create_backend(ofi_config(GetParam()));
    ASSERT_TRUE(sb.ok()) << sb.status().to_string();
    servers_b[i] = std::move(sb).value();
    auto l = servers_b[i]->listen("127.0.0.1:0");
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    listeners[i] = std::move(l).value();
    auto acc = std::async(std::launch::async, [&] { return listeners[i]->accept(deadline_in(10s), {}); });
    auto c = (*cb)->connect(listeners[i]->address(), deadline_in(10s), {});
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    auto s = acc.get();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    clients[i] = std::move(c).value();
    servers[i] = std::move(s).value();
  }
  std::vector<std::byte> h;
  auto early = clients[0]->recv_header(h, deadline_in(20ms), {});
  ASSERT_EQ(early.status().code(), StatusCode::timed_out) << early.status().to_string();
  const std::byte from1[3] = {std::byte('B'), std::byte(1), std::byte(1)};
  ASSERT_TRUE(servers[1]->send(from1, {}, deadline_in(10s), {}).ok());
  auto got1 = clients[1]->recv_header(h, deadline_in(10s), {});
  ASSERT_TRUE(got1.ok()) << got1.status().to_string();
  EXPECT_EQ(h, std::vector<std::byte>(std::begin(from1), std::end(from1)));
  const std::byte from0[2] = {std::byte('A'), std::byte(0)};
  ASSERT_TRUE(servers[0]->send(from0, {}, deadline_in(10s), {}).ok());
  auto got0 = clients[0]->recv_header(h, deadline_in(10s), {});
  ASSERT_TRUE(got0.ok()) << got0.status().to_string();
  EXPECT_EQ(h, std::vector<std::byte>(std::begin(from0), std::end(from0)));
  // And the other way, on the servers' side.
  ASSERT_TRUE(clients[1]->send(from1, {}, deadline_in(10s), {}).ok());
  ASSERT_TRUE(clients[0]->send(from0, {}, deadline_in(10s), {}).ok());
  ASSERT_TRUE(servers[0]->recv_header(h, deadline_in(10s), {}).ok());
  EXPECT_EQ(h, std::vector<std::byte>(std::begin(from0), std::end(from0)));
  ASSERT_TRUE(servers[1]->recv_header(h, deadline_in(10s), {}).ok());
  EXPECT_EQ(h, std::vector<std::byte>(std::begin(from1), std::end(from1)));
}

// An accept() whose deadline ends mid-handshake (the client's hello taken, the
// hello-ack not yet complete) loses no connection: the next call finishes it. The
// storage node accepts in 200 ms rounds; a hello that came late in a round used to be
// dropped, and its client, already connected, saw the connection closed at once.
// Here every accept's deadline is already over: a handshake whose ack does not
// complete at the first poll spans several calls. (Whether it does is the provider's
// timing, so this does not catch the old behaviour every run; the storage tests under
// TSan on a loaded machine did, about 1 run in 16.)
TEST_P(LibfabricProvider, AcceptPastItsDeadlineLosesNoConnection) {
  test_util::accept_past_its_deadline_loses_no_connection(ofi_config(GetParam()));
}

TEST_P(LibfabricProvider, OrderlyCloseIsSeenAtOnceAfterPendingMessages) {
  auto p = make_ofi_pair(GetParam());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  std::byte h[3] = {std::byte(1), std::byte(2), std::byte(3)};
  ASSERT_TRUE(p->client->send(h, {}, deadline_in(5s), {}).ok());
  p->client.reset();
  std::vector<std::byte> got;
  auto len = p->server->recv_header(got, deadline_in(5s), {});
  ASSERT_TRUE(len.ok()) << len.status().to_string();  // sent before the close: still delivered
  EXPECT_EQ(got.size(), 3u);
  // The close ends the wait (unavailable), not the deadline a minute away (timed_out).
  auto r = p->server->recv_header(got, deadline_in(60s), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::unavailable) << r.status().to_string();
}

// After Endpoint::kParkAfter (10 ms) with nothing, a waiting call parks and the
// progress thread sleeps on the queue's fd (tcp;ofi_rxm; shm keeps polling): a message
// after such a gap must still wake both, every time, and a cancel must end a parked
// wait. The sleeps only make the gaps; nothing is timed.
TEST_P(LibfabricProvider, MessagesAfterIdleGapsArriveAndCancelEndsAParkedWait) {
  auto p = make_ofi_pair(GetParam());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    auto echo = std::async(std::launch::async, [&]() -> Status {
      std::vector<std::byte> h;
      KVS_ASSIGN_OR_RETURN(const size_t body, p->server->recv_header(h, deadline_in(10s), {}));
      if (body != 0) return make_status(StatusCode::internal, "unexpected body of {} bytes", body);
      std::this_thread::sleep_for(30ms);  // the client's wait for the echo goes idle too
      return p->server->send(h, {}, deadline_in(10s), {});
    });
    std::this_thread::sleep_for(30ms);
    const auto sent = fill(40 + round, uint8_t(round));
    ASSERT_TRUE(p->client->send(sent, {}, deadline_in(10s), {}).ok());
    std::vector<std::byte> got;
    auto len = p->client->recv_header(got, deadline_in(10s), {});
    ASSERT_TRUE(len.ok()) << len.status().to_string();
    EXPECT_EQ(got, sent);
    const Status st = echo.get();
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  CancelToken cancel;
  auto waiting = std::async(std::launch::async, [&] {
    std::vector<std::byte> h;
    return p->server->recv_header(h, deadline_in(60s), cancel);
  });
  std::this_thread::sleep_for(30ms);
  cancel.cancel();
  auto r = waiting.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::cancelled) << r.status().to_string();
}

TEST_P(LibfabricProvider, TimedOutBodyCanBeRetried) {
  auto p = make_ofi_pair(GetParam());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  std::vector<std::byte> h;
  // Nothing sent: a header wait times out and the message that comes later is not lost.
  EXPECT_EQ(p->server->recv_header(h, deadline_in(50ms), {}).status().code(), StatusCode::timed_out);
  const size_t n = 100000;
  std::vector<std::byte> s(n, std::byte(7)), r(n);
  auto smr = p->client_backend->register_memory(s.data(), n, MemoryType::host);
  auto rmr = p->server_backend->register_memory(r.data(), n, MemoryType::host);
  ASSERT_TRUE(smr.ok() && rmr.ok());
  std::byte hdr[1] = {std::byte(9)};
  auto seq = p->client->post_send(hdr, smr->span(0, n));
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  auto len = p->server->recv_header(h, deadline_in(5s), {});
  ASSERT_TRUE(len.ok()) << len.status().to_string();
  ASSERT_EQ(*len, n);
  ASSERT_TRUE(p->server->recv_body(rmr->span(0, n), deadline_in(5s), {}).ok());
  EXPECT_TRUE(p->client->wait_sends(*seq, deadline_in(5s), {}).ok());
  EXPECT_EQ(r, s);
}

// A receive posted ahead takes its body as soon as the sender sends it: the sender's
// wait ends before the receiver calls recv_body (over ofi_rxm the post sent the
// message's clear at once, and the sender's progress thread sent the held body when
// the clear came, the sender itself idle), and recv_body then finds it there.
TEST_P(LibfabricProvider, ABodyPostedForAheadMovesBeforeRecvBody) {
  const size_t n = size_t(1) << 20;
  std::vector<std::byte> s(n, std::byte(7)), r(n);  // before the pair: they outlive it
  auto p = make_ofi_pair(GetParam());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  auto smr = p->client_backend->register_memory(s.data(), n, MemoryType::host);
  auto rmr = p->server_backend->register_memory(r.data(), n, MemoryType::host);
  ASSERT_TRUE(smr.ok() && rmr.ok());
  ASSERT_TRUE(p->server->post_recv(rmr->span(0, n)).ok());
  const std::byte hdr[1] = {std::byte(3)};
  auto seq = p->client->post_send(hdr, smr->span(0, n));
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  std::vector<std::byte> h;
  auto len = p->server->recv_header(h, deadline_in(10s), {});
  ASSERT_TRUE(len.ok()) << len.status().to_string();
  ASSERT_EQ(*len, n);
  EXPECT_TRUE(p->client->wait_sends(*seq, deadline_in(10s), {}).ok()) << "the body moved without recv_body";
  ASSERT_TRUE(p->server->recv_body(rmr->span(0, n), deadline_in(10s), {}).ok());
  EXPECT_EQ(r, s);
}

TEST_P(LibfabricProvider, PostedSendsAreZeroCopyAndWaitBreaksOnTimeout) {
  auto p = make_ofi_pair(GetParam());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  const size_t n = size_t(4) << 20;
  std::vector<std::byte> s(n, std::byte(1)), r(n);
  auto smr = p->client_backend->register_memory(s.data(), n, MemoryType::host);
  auto rmr = p->server_backend->register_memory(r.data(), n, MemoryType::host);
  ASSERT_TRUE(smr.ok() && rmr.ok());
  EXPECT_TRUE(p->client->wait_sends(0, deadline_in(1s), {}).ok());  // nothing posted yet
  std::byte hdr[1] = {std::byte(5)};
  auto seq = p->client->post_send(hdr, smr->span(0, n));
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  EXPECT_EQ(p->client->wait_sends(*seq + 1, deadline_in(1s), {}).code(), StatusCode::invalid_argument);
  // Changed after posting, before the peer reads: zero copy sends what is there then.
  std::memset(s.data(), 2, n);
  std::vector<std::byte> h;
  auto len = p->server->recv_header(h, deadline_in(5s), {});
  ASSERT_TRUE(len.ok()) << len.status().to_string();
  ASSERT_TRUE(p->server->recv_body(rmr->span(0, n), deadline_in(5s), {}).ok());
  ASSERT_TRUE(p->client->wait_sends(*seq, deadline_in(5s), {}).ok());
  // tcp;ofi_rxm reads a rendezvous body only once matched (shm may copy ahead).
  if (GetParam() == "tcp;ofi_rxm") EXPECT_EQ(r[n - 1], std::byte(2));
  // A peer that does not read: the wait times out and the connection is broken.
  seq = p->client->post_send(hdr, smr->span(0, n));
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  EXPECT_EQ(p->client->wait_sends(*seq, deadline_in(200ms), {}).code(), StatusCode::timed_out);
  auto again = p->client->post_send(hdr, {});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::unavailable);
}

// A thread that posts a burst and then waits for the peer's replies on the same
// thread, the peer echoing from its own: more messages than the provider's queue
// takes at once, so some pieces are pushed back (EAGAIN) and wait in the
// connection's backlog. The receive calls flush them; before they did, the reply to
// the first message still queued never came (recv_header timed out at reply 512 on
// shm, 2048 on tcp;ofi_rxm).
TEST_P(LibfabricProvider, QueuedSendsProgressWhileTheSenderReceives) {
  auto p = make_ofi_pair(GetParam());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  // libfabric 1.17 takes 512 such messages on shm and 2048 on tcp;ofi_rxm before it
  // answers EAGAIN (its default queue sizes): more than both.
  const int count = 2304;
  const size_t n = size_t(256) << 10;  // rendezvous on tcp;ofi_rxm: a send stays queued until matched
  std::vector<std::byte> out(n), back(n), echo(n);
  for (size_t i = 0; i < n; ++i) out[i] = std::byte(uint8_t(i * 7 + 1));
  auto omr = p->client_backend->register_memory(out.data(), n, MemoryType::host);
  auto bmr = p->client_backend->register_memory(back.data(), n, MemoryType::host);
  auto emr = p->server_backend->register_memory(echo.data(), n, MemoryType::host);
  ASSERT_TRUE(omr.ok() && bmr.ok() && emr.ok());
  auto echoer = std::async(std::launch::async, [&]() -> Status {
    std::vector<std::byte> h;
    for (int i = 0; i < count; ++i) {
      KVS_ASSIGN_OR_RETURN(size_t len, p->server->recv_header(h, deadline_in(20s), {}));
      KVS_RETURN_IF_ERROR(p->server->recv_body(emr->span(0, len), deadline_in(20s), {}));
      KVS_RETURN_IF_ERROR(p->server->send(h, emr->span(0, len), deadline_in(20s), {}));
    }
    return {};
  });
  uint64_t last = 0;
  for (int i = 0; i < count; ++i) {
    const uint32_t id = uint32_t(i);
    std::byte h[4];
    std::memcpy(h, &id, 4);
    auto seq = p->client->post_send(h, omr->span(0, n));
    ASSERT_TRUE(seq.ok()) << i << ": " << seq.status().to_string();
    last = *seq;
  }
  std::vector<std::byte> h;
  for (int i = 0; i < count; ++i) {
    auto len = p->client->recv_header(h, deadline_in(20s), {});
    ASSERT_TRUE(len.ok()) << "reply " << i << ": " << len.status().to_string();
    ASSERT_EQ(*len, n);
    uint32_t id = 0;
    ASSERT_EQ(h.size(), 4u);
    std::memcpy(&id, h.data(), 4);
    EXPECT_EQ(id, uint32_t(i));
    ASSERT_TRUE(p->client->recv_body(bmr->span(0, n), deadline_in(20s), {}).ok()) << i;
  }
  EXPECT_EQ(back, out);
  EXPECT_TRUE(p->client->wait_sends(last, deadline_in(20s), {}).ok());
  const Status echoed = echoer.get();
  EXPECT_TRUE(echoed.ok()) << echoed.to_string();
}

// Every message arrives, however the provider's progress interleaves with our calls.
// libfabric 1.17's shm declares FI_THREAD_SAFE, yet with a receive or a send posted
// while another thread polled the endpoint's completion queue it lost a message now
// and then: a header whose inject had completed never reached the receive posted for
// it, or a 3 MiB send never completed. DeclaresProviderAndRoundTrips failed about 2
// runs in 100 that way (21 in 1000 alone) until the endpoint serialized its calls into
// the provider (0 in 3000 since). This runs its exchange on 60 fresh shm pairs (before
// the fix it failed 2 runs in 2, at pairs 34 and 49 of 100) and on 4 tcp;ofi_rxm ones,
// whose connections take long to set up; a quarter of that under a sanitizer, where a
// pair costs about ten times as much (the plain build's run is the one that counts).
// Under ASan it also crashed about 1 run in 40 (SIGSEGV in libfabric's shm address
// insert) when two of its fresh listeners drew the same port: the provider kept the
// closed one's unmapped memory under the name (ofi_shm_local.hpp; 0 in 100 since).
TEST_P(LibfabricProvider, EveryMessageArrivesOnFreshConnections) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  constexpr int kShare = 4;
#else
  constexpr int kShare = 1;
#endif
  const int pairs = (GetParam() == "shm" ? 60 : 4) / kShare;
  for (int c = 0; c < pairs; ++c) {
    SCOPED_TRACE(::testing::Message() << "pair " << c);
    auto p = make_ofi_pair(GetParam());
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    round_trip_every_size(*p);
    if (HasFatalFailure()) return;
  }
}

TEST_P(LibfabricProvider, OneSidedReadsOfAnExposedRegion) {
  // The buffers outlive the endpoints (declared first): the owner's provider thread
  // sent from `src`, and only joining it orders that before the free for TSan.
  const size_t n = (size_t(5) << 20) + 123;
  auto src = test_util::pattern(n, 17);
  std::vector<std::byte> dst(n), back(4096);
  auto p = make_ofi_pair(GetParam());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_TRUE(p->client_backend->capabilities().one_sided_read) << "both providers here grant FI_RMA reads";
  auto smr = p->server_backend->register_memory(src.data(), n, MemoryType::host);
  auto dmr = p->client_backend->register_memory(dst.data(), n, MemoryType::host);
  ASSERT_TRUE(smr.ok() && dmr.ok());
  auto ex = smr->expose();
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  ASSERT_TRUE(p->client->read(dmr->span(0, n), *ex, 0, deadline_in(10s), {}).ok());
  EXPECT_EQ(dst, src);
  std::fill(dst.begin(), dst.end(), std::byte{0});
  ASSERT_TRUE(p->client->read(dmr->span(7, 4096), *ex, n - 4096, deadline_in(10s), {}).ok());
  EXPECT_EQ(0, std::memcmp(dst.data() + 7, src.data() + n - 4096, 4096));
  // The owner reads the client's region too (a shared listener endpoint).
  auto cex = dmr->expose();
  ASSERT_TRUE(cex.ok());
  auto bmr = p->server_backend->register_memory(back.data(), back.size(), MemoryType::host);
  ASSERT_TRUE(bmr.ok());
  ASSERT_TRUE(p->server->read(bmr->span(0, 4096), *cex, 7, deadline_in(10s), {}).ok());
  EXPECT_EQ(0, std::memcmp(back.data(), src.data() + n - 4096, 4096));
  // Refused before anything is posted; the connection stays usable.
  EXPECT_EQ(p->client->read(dmr->span(0, 2), *ex, n - 1, deadline_in(1s), {}).code(), StatusCode::out_of_range);
  RemoteRegion bad = *ex;
  bad.key.pop_back();
  EXPECT_EQ(p->client->read(dmr->span(0, 16), bad, 0, deadline_in(1s), {}).code(), StatusCode::invalid_argument);
  bad = *ex;
  bad.key.back() = std::byte{7};
  EXPECT_EQ(p->client->read(dmr->span(0, 16), bad, 0, deadline_in(1s), {}).code(), StatusCode::invalid_argument);
  CancelToken cancelled;
  cancelled.cancel();
  EXPECT_EQ(p->client->read(dmr->span(0, 16), *ex, 0, deadline_in(1s), cancelled).code(), StatusCode::cancelled);
  std::vector<std::byte> loose(16);  // not registered (tcp;ofi_rxm needs FI_MR_LOCAL)
  const Status unreg = p->client->read(loose, *ex, 0, deadline_in(1s), {});
  if (!unreg.ok()) EXPECT_EQ(unreg.code(), StatusCode::invalid_argument) << unreg.to_string();
  ASSERT_TRUE(p->client->read(dmr->span(0, 64), *ex, 64, deadline_in(10s), {}).ok());
  EXPECT_EQ(0, std::memcmp(dst.data(), src.data() + 64, 64));
}

// A read from an owner process that stops answering (SIGSTOP) ends by its deadline,
// and nothing lands in the caller's buffer after it returned, even once the owner
// runs again (libfabric cannot cancel an RMA read: the endpoint is closed under it).
TEST_P(LibfabricProvider, ReadFromAStalledOwnerEndsByItsDeadline) {
  const size_t n = size_t(64) << 20;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // the owner: no gtest in here, only _exit codes
    ::close(fds[0]);
    auto b = create_backend(ofi_config(GetParam()));
    if (!b.ok()) ::_exit(2);
    auto l = (*b)->listen("127.0.0.1:0");
    if (!l.ok()) ::_exit(3);
    auto src = test_util::pattern(n, 23);
    auto mr = (*b)->register_memory(src.data(), n, MemoryType::host);
    if (!mr.ok()) ::_exit(4);
    auto ex = mr->expose();
    if (!ex.ok()) ::_exit(5);
    const std::string addr = (*l)->address();
    if (::write(fds[1], addr.c_str(), addr.size() + 1) != ssize_t(addr.size() + 1)) ::_exit(6);
    auto c = (*l)->accept(deadline_in(20s), {});
    if (!c.ok()) ::_exit(7);
    if (!(*c)->send(encode_remote(*ex), {}, deadline_in(20s), {}).ok()) ::_exit(8);
    std::this_thread::sleep_for(60s);  // serves reads from its progress thread until killed
    ::_exit(0);
  }
  ::close(fds[1]);
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{pid};
  char addr[256] = {};
  pollfd pfd{fds[0], POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 20000), 1) << "the owner process did not start";
  ASSERT_GT(::read(fds[0], addr, sizeof addr - 1), 0);
  ::close(fds[0]);
  auto b = create_backend(ofi_config(GetParam()));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto c = (*b)->connect(addr, deadline_in(20s), {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::vector<std::byte> h;
  ASSERT_TRUE((*c)->recv_header(h, deadline_in(20s), {}).ok());
  auto remote = decode_remote(h);
  ASSERT_TRUE(remote.ok()) << remote.status().to_string();
  std::vector<std::byte> dst(n);
  auto dmr = (*b)->register_memory(dst.data(), n, MemoryType::host);
  ASSERT_TRUE(dmr.ok());
  const auto want = test_util::pattern(n, 23);
  ASSERT_TRUE((*c)->read(dmr->span(0, 1 << 20), *remote, 0, deadline_in(10s), {}).ok());
  EXPECT_EQ(0, std::memcmp(dst.data(), want.data(), 1 << 20));

  ::kill(pid, SIGSTOP);
  std::fill(dst.begin(), dst.end(), std::byte{0xEE});
  const auto t0 = Clock::now();
  const Status st = (*c)->read(dmr->span(0, n), *remote, 0, deadline_in(300ms), {});
  const auto took = Clock::now() - t0;
  std::printf("[ libfabric %s ] 64 MiB read from a stopped owner: %s after %.0f ms\n", GetParam().c_str(),
              st.ok() ? "completed" : st.to_string().c_str(),
              std::chrono::duration<double, std::milli>(took).count());
  if (st.ok()) {
    // A provider that reads the owner's memory without its help (shm through CMA)
    // completes regardless: then the data must be right.
    EXPECT_EQ(dst, want);
  } else {
    EXPECT_EQ(st.code(), StatusCode::timed_out) << st.to_string();  // how long it took is printed, not asserted
    const auto snapshot = dst;
    ::kill(pid, SIGCONT);
    // The owner runs again: a read still in flight would land now. The pause gives it
    // the chance; whatever its length, bytes landing would be a failure, never a pass.
    std::this_thread::sleep_for(300ms);
    EXPECT_TRUE(dst == snapshot) << "bytes landed in the buffer after read returned";
    EXPECT_EQ((*c)->read(dmr->span(0, 16), *remote, 0, deadline_in(1s), {}).code(), StatusCode::unavailable);
  }
}

// Many 1 MiB messages one way arrive whole and in order. (Their rate is measured by
// kvstream-perf --backend libfabric, against fi_rma_bw in perf/transport-anchors.sh.)
TEST_P(LibfabricProvider, ManyOneMiBMessagesArriveWholeAndInOrder) {
  auto p = make_ofi_pair(GetParam());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  const size_t n = size_t(1) << 20;
  const int count = 64;
  std::vector<std::byte> s(n, std::byte(1)), r(n);
  auto smr = p->client_backend->register_memory(s.data(), n, MemoryType::host);
  auto rmr = p->server_backend->register_memory(r.data(), n, MemoryType::host);
  ASSERT_TRUE(smr.ok() && rmr.ok());
  std::thread rx([&] {
    std::vector<std::byte> h;
    for (int i = 0; i < count; ++i) {
      auto len = p->server->recv_header(h, deadline_in(30s), {});
      ASSERT_TRUE(len.ok()) << len.status().to_string();
      ASSERT_EQ(*len, n);
      ASSERT_TRUE(p->server->recv_body(rmr->span(0, *len), deadline_in(30s), {}).ok());
      ASSERT_EQ(r.front(), std::byte(i + 1)) << "message " << i;
      ASSERT_EQ(r.back(), std::byte(i + 1)) << "message " << i;
    }
  });
  std::byte h[8] = {};
  for (int i = 0; i < count; ++i) {
    // Each message carries its index (send returns once the buffer may be reused).
    std::fill(s.begin(), s.end(), std::byte(i + 1));
    ASSERT_TRUE(p->client->send(h, smr->span(0, n), deadline_in(30s), {}).ok());
  }
  rx.join();
}

INSTANTIATE_TEST_SUITE_P(Providers, LibfabricProvider, ::testing::Values("tcp;ofi_rxm", "shm"),
                         [](const auto& info) {
                           return info.param == "shm" ? std::string("libfabric_shm") : std::string("libfabric_tcp_rxm");
                         });

TEST(libfabric, CudaMemoryIsAClearErrorWithoutHmem) {
  if (!have_libfabric()) GTEST_SKIP() << "libfabric backend not built";
  BackendConfig cfg = ofi_config("tcp;ofi_rxm");
  cfg.memory = MemoryType::cuda;
  auto b = create_backend(cfg);
  if (b.ok()) {
    EXPECT_TRUE((*b)->capabilities().cuda_memory);  // a provider with FI_HMEM
    return;
  }
  EXPECT_EQ(b.status().code(), StatusCode::unsupported) << b.status().to_string();
  EXPECT_NE(b.status().message().find("cuda"), std::string::npos) << b.status().to_string();
  // And host backends refuse cuda registrations.
  auto h = create_backend(ofi_config("tcp;ofi_rxm"));
  ASSERT_TRUE(h.ok());
  std::vector<std::byte> buf(4096);
  auto r = (*h)->register_memory(buf.data(), buf.size(), MemoryType::cuda);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::unsupported);
}

TEST(libfabric, UnknownProviderIsUnavailable) {
  if (!have_libfabric()) GTEST_SKIP() << "libfabric backend not built";
  auto b = create_backend(ofi_config("no_such_provider"));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::unavailable) << b.status().to_string();
}

}  // namespace

}  // namespace kvstream::test_ofi


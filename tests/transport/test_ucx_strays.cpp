// Stray messages on a UCX worker (transport/ucx/ucx_strays.hpp): which tags are
// strays, the probes that reach them all, and the sweep that drops them while a
// connection's own messages, early ones included, stay for it.
#include <gtest/gtest.h>

#include <random>

#include "tests/transport/ucx_test_util.hpp"
#include "transport/ucx/ucx_strays.hpp"
#include "transport/ucx/ucx_wire.hpp"

namespace kvstream::test_ucx {

namespace {

using namespace kvstream::transport::ucx_detail;

// Three open connections: one at the start of its sequence with keys, one whose window
// wraps around 2^32, one without keys. Every tag near the windows' edges, under each
// kind and under neighbouring rx ids, and a million random ones: a tag is a stray
// exactly when some filter of the cover matches it.
TEST(UcxStrays, TheCoverMatchesExactlyTheStrays) {
  const std::vector<ExpectedSpace> open = {
      {0x000101, 0, 0x9e3779b9}, {0x3f0002, 0xfffffff0u, 0x12345678}, {0xabcdef, 70000, 0}};
  const std::vector<TagFilter> cover = stray_cover(open);
  EXPECT_LE(cover.size(), 200 * open.size()) << "probes per sweep";
  size_t wrong = 0;
  uint64_t first_wrong = 0;
  auto check = [&](uint64_t tag) {
    bool covered = false;
    for (const auto& f : cover) covered |= matches(f, tag);
    if (covered != is_stray(tag, open) && wrong++ == 0) first_wrong = tag;
  };
  for (const auto& s : open) {
    for (uint32_t rx : {s.rx_id - 1, s.rx_id, s.rx_id + 1}) {
      for (uint64_t kind : {uint64_t(0), kHeaderKind, kBodyKind, uint64_t(3), uint64_t(255)}) {
        for (uint32_t d : {0u, 1u, uint32_t(kMaxLead - 1), uint32_t(kMaxLead), uint32_t(kMaxLead + 1), ~0u, ~0u - 1,
                           0x80000000u}) {
          const uint32_t seq = s.from + d;
          const uint32_t x = kind == kBodyKind ? s.body_xor : 0;
          check(make_tag(rx, kind, seq ^ x));
          check(make_tag(rx, kind, seq));
        }
      }
    }
  }
  // Kept: what each connection will receive; strays: behind it, far ahead, a body
  // under a tag not read through the key.
  EXPECT_FALSE(is_stray(make_tag(0x000101, kHeaderKind, 5), open));
  EXPECT_FALSE(is_stray(make_body_tag(0x000101, 5, uint64_t(0x9e3779b9) << 32), open));
  EXPECT_TRUE(is_stray(make_tag(0x000101, kBodyKind, 5), open));
  EXPECT_FALSE(is_stray(make_tag(0x3f0002, kHeaderKind, 3), open));  // past the wrap
  EXPECT_TRUE(is_stray(make_tag(0x3f0002, kHeaderKind, 0xffffffe0u), open));
  EXPECT_TRUE(is_stray(make_tag(0xabcdef, kHeaderKind, 69999), open));
  EXPECT_TRUE(is_stray(make_tag(0xabcdee, kHeaderKind, 70000), open));
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    uint64_t tag = rng();
    if (i % 2) tag = (tag & ~(uint64_t(0xff) << 56)) | uint64_t(1 + i % 4 / 2) << 56;  // a kind we send
    if (i % 4 == 1) tag = (tag & ~(Tag::kConnMask << 32)) | uint64_t(open[size_t(i) % 3].rx_id) << 32;
    check(tag);
  }
  EXPECT_EQ(wrong, 0u) << "first: " << std::hex << first_wrong;
  // No connection open: every tag is a stray, and one filter matches them all.
  const auto none = stray_cover({});
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].mask, 0u);
}

#if KVSTREAM_HAVE_UCX
/// Whether a message under exactly `tag` waits in `eng`'s unexpected queue. Requires
/// eng.mu.
bool waiting_locked(Engine& eng, uint64_t tag) {
  ucp_tag_recv_info_t info{};
  return ucp_tag_probe_nb(eng.worker, tag, kExactTag, 0, &info) != nullptr;
}

/// Waits (progressing `eng`'s worker) until a message under exactly `tag` waits in
/// its unexpected queue.
bool wait_unexpected(Engine& eng, uint64_t tag) {
  return eng.wait_quiet([&] { return waiting_locked(eng, tag); }, 30s);
}

/// Whether a message under exactly `tag` waits in `eng`'s unexpected queue now.
bool waiting(Engine& eng, uint64_t tag) {
  std::lock_guard lk(eng.mu);
  return waiting_locked(eng, tag);
}

// A node's worker holds, in this order: headers a client sent ahead of the node's
// posted receives (its own messages, kept for it), then what another peer sent under
// tags no receive will take: an rx id nobody uses, the id of a connection the node
// closed, a kind we never send, the client's id far ahead of it, a body tag not read
// through the client's key, and a rendezvous message (64 KiB over tcp) whose sender
// waits for a receiver. Without a sweep all of it stays (as it did before sweeps,
// and the rendezvous sender's send never ended). A first sweep keeps everything:
// the oldest message is the client's, first in line for less than it takes to be
// called stuck. The next, which counts it stuck at once and looks behind it, drops
// the six strays, ends the rendezvous send, and leaves the client's messages, which
// the node then reads in order.
TEST(UcxStrays, TheSweepDropsStraysBehindAConnectionsEarlyMessagesAndKeepsThem) {
  if (!have_ucx()) GTEST_SKIP() << "ucx backend not built";
  const BackendConfig cfg = ucx_config("tcp");
  auto node = UcxNode::start(cfg);
  ASSERT_TRUE(node.ok()) << node.status().to_string();
  Engine& ne = *node->eng;
  ne.auto_sweep = false;
  auto client = node->connect(cfg);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  auto attacker = node->connect(cfg);
  ASSERT_TRUE(attacker.ok()) << attacker.status().to_string();
  uint32_t closed_rx = 0;
  {
    auto gone = node->connect(cfg);
    ASSERT_TRUE(gone.ok()) << gone.status().to_string();
    closed_rx = gone->first.cs->peer_rx_id;
    gone->second.reset();  // the node closes its side
  }
  RawClient& c = client->first;
  RawClient& a = attacker->first;
  const uint32_t rx = c.cs->peer_rx_id;
  ASSERT_TRUE(c.cs->keyed);

  // 40 header-only messages: the node posted 32 header receives, 8 wait unexpected.
  const size_t kSent = 40;
  for (size_t i = 0; i < kSent; ++i) ASSERT_TRUE(c.conn->send(fill(16, uint8_t(i)), {}, deadline_in(10s), {}).ok());
  ASSERT_TRUE(wait_unexpected(ne, make_tag(rx, kHeaderKind, kSent - 1)));

  uint32_t unused_rx = 0;
  {
    std::lock_guard lk(ne.mu);
    for (unused_rx = rx ^ 0x5a5a5a; unused_rx == 0 || unused_rx == closed_rx ||
                                    std::any_of(ne.conns.begin(), ne.conns.end(),
                                                [&](const ConnState* s) { return s->rx_id == unused_rx; });)
      unused_rx = (unused_rx + 1) & kRxIdMask;
  }
  const uint32_t key_hi = uint32_t(c.cs->peer_key >> 32);
  const std::vector<uint64_t> strays = {
      make_tag(unused_rx, kHeaderKind, 0),
      make_tag(closed_rx, kHeaderKind, 0),
      make_tag(rx, 3, 0),
      make_tag(rx, kHeaderKind, kMaxLead + 5),
      make_tag(rx, kBodyKind, key_hi ^ 0x80000000u),  // decodes to a sequence 2^31 ahead
  };
  const std::vector<std::byte> small(100, std::byte{0x77});
  for (uint64_t t : strays) send_raw(a, small, t);
  // The rendezvous one: posted, not waited for (its sender waits for a receiver).
  const std::vector<std::byte> big(64 << 10, std::byte{0x88});
  const uint64_t big_tag = make_tag(unused_rx, kBodyKind, 9);
  Op big_op;
  {
    std::lock_guard lk(a.eng->mu);
    big_op.arm();
    ucp_request_param_t p = send_param(big_op);
    ASSERT_TRUE(big_op.track(ucp_tag_send_nbx(a.cs->ep, big.data(), big.size(), big_tag, &p)));
  }
  for (uint64_t t : strays) ASSERT_TRUE(wait_unexpected(ne, t)) << std::hex << t;
  ASSERT_TRUE(wait_unexpected(ne, big_tag));
  {
    std::lock_guard lk(a.eng->mu);
    EXPECT_FALSE(big_op.done) << "the rendezvous send waits for a receiver";
  }

  {
    std::lock_guard lk(ne.mu);
    // The client's message is first in line for the first time: not yet taken as
    // stuck (an hour would be needed), so the sweep does not look behind it.
    const auto head = ne.sweep_strays_locked(/*look_behind=*/true, std::chrono::hours(1));
    EXPECT_EQ(head.dropped, 0u) << "the oldest message is the client's";
    EXPECT_FALSE(head.looked_behind);
  }
  for (uint64_t t : strays) EXPECT_TRUE(waiting(ne, t)) << std::hex << t;
  {
    std::lock_guard lk(ne.mu);
    const auto all = ne.sweep_strays_locked(/*look_behind=*/true, /*stuck_after=*/{});
    EXPECT_EQ(all.dropped, strays.size() + 1);
    EXPECT_TRUE(all.looked_behind);
    EXPECT_EQ(ne.strays_dropped, strays.size() + 1);
  }
  for (uint64_t t : strays) EXPECT_FALSE(waiting(ne, t)) << std::hex << t;
  EXPECT_FALSE(waiting(ne, big_tag));
  for (uint32_t seq = 32; seq < kSent; ++seq) EXPECT_TRUE(waiting(ne, make_tag(rx, kHeaderKind, seq))) << seq;
  ASSERT_TRUE(a.eng->wait_quiet([&] { return big_op.done; }, 30s)) << "the rendezvous send ends once swept";
  {
    std::lock_guard lk(a.eng->mu);
    big_op.release();
  }

  for (size_t i = 0; i < kSent; ++i) {
    std::vector<std::byte> h;
    auto len = client->second->recv_header(h, deadline_in(10s), {});
    ASSERT_TRUE(len.ok()) << len.status().to_string();
    EXPECT_EQ(*len, 0u);
    EXPECT_EQ(h, fill(16, uint8_t(i))) << i;
  }
  {
    std::lock_guard lk(ne.mu);
    ucp_tag_recv_info_t info{};
    EXPECT_EQ(ucp_tag_probe_nb(ne.worker, 0, 0, 0, &info), nullptr) << "nothing left unexpected";
  }
  // The attacker's own connection still works both ways.
  expect_message(*a.conn, *attacker->second, fill(8, 1), fill(5000, 2));
  expect_message(*attacker->second, *a.conn, fill(8, 3), {});
}

// With nothing kept ahead of them, the background thread drops a flood of strays on
// its own, and a connection's message sent after them arrives as sent.
TEST(UcxStrays, TheBackgroundThreadDropsAFloodOfStrays) {
  if (!have_ucx()) GTEST_SKIP() << "ucx backend not built";
  const BackendConfig cfg = ucx_config("tcp");
  auto node = UcxNode::start(cfg);
  ASSERT_TRUE(node.ok()) << node.status().to_string();
  Engine& ne = *node->eng;
  auto attacker = node->connect(cfg);
  ASSERT_TRUE(attacker.ok()) << attacker.status().to_string();
  RawClient& a = attacker->first;
  const uint32_t own = a.cs->peer_rx_id;
  const std::vector<std::byte> small(200, std::byte{0x99});
  const size_t kFlood = 500;
  for (size_t i = 0; i < kFlood; ++i) {
    const auto rx = uint32_t((own + 1 + i) & kRxIdMask);  // never the attacker's own: i < 2^24 - 1
    send_raw(a, small, make_tag(rx == 0 ? 1 : rx, i % 2 ? kHeaderKind : kBodyKind, uint32_t(i)));
  }
  ASSERT_TRUE(ne.wait_quiet(
      [&] {
        ucp_tag_recv_info_t info{};
        return ne.strays_dropped == kFlood && !ucp_tag_probe_nb(ne.worker, 0, 0, 0, &info);
      },
      60s))
      << ne.strays_dropped << " of " << kFlood << " dropped";
  EXPECT_EQ(ne.stray_bytes, kFlood * small.size());
  expect_message(*a.conn, *attacker->second, fill(8, 4), fill(5000, 5));
}
#endif

}  // namespace

}  // namespace kvstream::test_ucx

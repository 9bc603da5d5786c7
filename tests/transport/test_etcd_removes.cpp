// Removes across a node's absence from its etcd cluster (docs/protocol.md, "Removes"):
// a node killed, or stalled past its lease while its process runs on, misses a remove;
// when it comes back, what it held waits behind its fence until the members have
// handed it their removes, goes when it was away longer than they remember removes,
// and is looked up where a member forgot a remove made since. The cluster is the one
// of test_etcd_membership.cpp (etcd_cluster.hpp).
#include <gtest/gtest.h>

#include "tests/transport/etcd_cluster.hpp"
#include "tests/transport/free_port.hpp"
#include "tests/transport/metrics_scrape.hpp"

namespace kvstream::test_etcd_removes {

using namespace kvstream::test_etcd;

namespace {

const std::string kKept = "ctx-kept";

// Three nodes settled (each started with `extra`) and a client of them, kCtx and kKept
// written (chunks 0 to `chunks` - 1) through it; then three[2] (`away`) killed holding
// `held` (what it held of kCtx; with `paused`, stopped where it is), the other two
// settled without it, and kCtx removed through the client (tried again while its watch
// may still name the node gone: every member must take a remove).
struct Away {
  EtcdCluster cl;
  std::vector<std::string> three;
  std::string away;
  std::unique_ptr<storage::Client> client;
  std::map<uint32_t, uint64_t> held;
};

// Sets `a` up. Fatal failures end the calling test.
void remove_while_away(Away& a, uint32_t chunks, size_t bytes, const std::vector<std::string>& extra = {},
                       bool paused = false) {
  ASSERT_TRUE(a.cl.etcd.started());
  a.three = start_settled(a.cl, 3, 0, false, extra);
  ASSERT_EQ(a.three.size(), 3u);
  a.away = a.three[2];
  auto connected = cluster::connect(a.cl.client_config(), deadline_in(5000ms));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  a.client = std::move(connected).value();
  storage::Client& client = *a.client;
  for (uint32_t c = 0; c < chunks; ++c) {
    ASSERT_TRUE(client.put(kCtx, c, 0, payload(c, bytes), deadline_in(5000ms)).ok()) << c;
    ASSERT_TRUE(client.put(kKept, c, 0, payload(c, bytes), deadline_in(5000ms)).ok()) << c;
  }
  a.held = holdings(a.away);
  ASSERT_FALSE(a.held.empty());
  // A node that goes on has its cache too: read once, each chunk is in it.
  if (paused)
    for (const auto& [c, b] : a.held) ASSERT_FALSE(read_direct(a.away, c, bytes).empty()) << c;
  if (paused) a.cl.pause(a.away);
  else a.cl.kill(a.away);
  // Nodes that keep their surplus copies report no trim.
  const bool trims = std::find(extra.begin(), extra.end(), "--keep-surplus-copies") == extra.end();
  ASSERT_FALSE(wait_settled(a.cl.etcd.config(), {a.three[0], a.three[1]}, deadline_in(30000ms), trims).empty());
  Status removed;
  for (int attempt = 0; attempt < 50; ++attempt) {
    if ((removed = client.remove(kCtx, deadline_in(5000ms))).ok()) break;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(removed.ok()) << removed.to_string();
}

// After the killed node's return as one of `again`: they settle (trimmed), and none
// holds or serves kCtx; `handed_on` is the removes their passes handed on. Fatal
// failures end the calling test.
void settled_with_kctx_removed(EtcdCluster& cl, storage::Client& client, const std::vector<std::string>& again,
                               uint32_t chunks, size_t bytes, uint64_t& handed_on) {
  const auto reports = wait_settled(cl.etcd.config(), again, deadline_in(30000ms), /*trimmed=*/true);
  ASSERT_FALSE(reports.empty()) << "the rebalance after the return did not finish";
  for (const auto& r : reports) handed_on += r.removes_handed_on;
  for (const auto& a : again) EXPECT_TRUE(holdings(a).empty()) << a << " holds a removed context";
  EXPECT_EQ(client.stat(kCtx, deadline_in(5000ms)).status().code(), StatusCode::not_found);
  EXPECT_EQ(read_all(client, chunks, bytes), 0) << "a removed chunk was read";
}

// Whether `node` serves kKept again (its fence lifted: what it held is served) within
// 30 s.
bool serves_kept_again(const std::string& node) {
  for (auto until = deadline_in(30000ms); Clock::now() < until; std::this_thread::sleep_for(20ms))
    if (!holdings_of(node, kKept).empty()) return true;
  return false;
}

// A node is killed holding copies of a context; while it is away (out of the
// membership) a client removes the context from every member. The node comes back
// on its old disk: it serves nothing it held until the members have handed it the
// remove, so it drops its copies instead of serving them or handing them to their
// owners, and the context stays removed. Another context, not removed, is served by
// it again once they have.
TEST_F(EtcdMembership, ARemoveMadeWhileANodeWasAwayStaysMadeWhenItComesBack) {
  constexpr uint32_t kChunks = 48;
  constexpr size_t kBytes = 4 * 1024;
  Away a;
  remove_while_away(a, kChunks, kBytes);
  if (HasFatalFailure()) return;
  auto& [cl, three, away, client, held_chunks] = a;
  const size_t held = held_chunks.size();
  const std::vector<std::string> two = {three[0], three[1]};

  const std::string back = cl.start_node_on(cl.store_of(away));
  ASSERT_FALSE(back.empty());
  const auto started = Clock::now();
  // At once, before the members' passes (after their settle): none of its old copies.
  for (const auto& [c, bytes] : held_chunks) EXPECT_TRUE(read_direct(back, c, kBytes).empty()) << "chunk " << c;
  ASSERT_TRUE(serves_kept_again(back)) << "the node that came back never served what it held again";
  const auto fenced_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count();
  uint64_t handed_on = 0;
  settled_with_kctx_removed(cl, *client, {two[0], two[1], back}, kChunks, kBytes, handed_on);
  if (HasFatalFailure()) return;
  EXPECT_GE(handed_on, 1u) << "no member handed the remove to the node that came back";
  // The context not removed: what the returning node holds of it is served again.
  auto d = direct(back);
  ASSERT_TRUE(d);
  auto kept_there = d->stat(kKept, deadline_in(5000ms));
  ASSERT_TRUE(kept_there.ok()) << kept_there.status().to_string();
  EXPECT_FALSE(kept_there->empty());
  std::printf("return: %zu copies on the node that came back, %llu removes handed to it, what it held served "
              "again %lld ms after its start\n",
              held, static_cast<unsigned long long>(handed_on), static_cast<long long>(fenced_ms));
}

// The same with the surplus copies kept (--keep-surplus-copies): the node that comes
// back is fenced all the same, and its trim lifts the fence and drops nothing else.
TEST_F(EtcdMembership, ANodeKeepingSurplusCopiesServesNothingItHeldUntilHandedTheRemoves) {
  constexpr uint32_t kChunks = 24;
  constexpr size_t kBytes = 4 * 1024;
  const std::vector<std::string> keep = {"--keep-surplus-copies"};
  Away a;
  remove_while_away(a, kChunks, kBytes, keep);
  if (HasFatalFailure()) return;
  auto& [cl, three, away, client, held_chunks] = a;
  const std::string back = cl.start_node_on(cl.store_of(away), 0, keep);
  ASSERT_FALSE(back.empty());
  int served = 0;
  for (const auto& [c, bytes] : held_chunks) served += !read_direct(back, c, kBytes).empty();
  EXPECT_EQ(served, 0) << "of " << held_chunks.size() << " chunks of the removed context it held";
  const std::vector<std::string> again = {three[0], three[1], back};
  const auto reports = wait_settled(cl.etcd.config(), again, deadline_in(30000ms));
  ASSERT_FALSE(reports.empty()) << "the rebalance after the return did not finish";
  uint64_t handed_on = 0;
  for (const auto& r : reports) handed_on += r.removes_handed_on;
  EXPECT_GE(handed_on, 1u) << "no member handed the remove to the node that came back";
  ASSERT_TRUE(serves_kept_again(back)) << "the node that came back never served what it held again";
  EXPECT_TRUE(holdings(back).empty()) << "it holds the removed context";
  EXPECT_EQ(read_all(*client, kChunks, kBytes), 0) << "a removed chunk was read";
  EXPECT_EQ(read_all(*client, kChunks, kBytes, kKept), int(kChunks)) << "the context not removed";
}

// The same, but the node comes back after longer than the members remember removes
// (4 s here, 24 h by default): none can hand it the remove any more. Its member mark,
// renewed with its lease, says it was away that long, so it drops everything it held
// at start instead of serving its copies of the removed context and handing them to
// their owners. The context not removed is read whole from its other copies.
TEST_F(EtcdMembership, ANodeAwayLongerThanRemovesAreRememberedComesBackEmpty) {
  constexpr uint32_t kChunks = 24;
  constexpr size_t kBytes = 4 * 1024;
  const std::vector<std::string> memory = {"--remove-memory-s", "4"};
  Away a;
  remove_while_away(a, kChunks, kBytes, memory);
  if (HasFatalFailure()) return;
  auto& [cl, three, away, client, held_chunks] = a;
  const std::vector<std::string> two = {three[0], three[1]};
  // Until the members have forgotten the remove (their memory, and a second).
  std::this_thread::sleep_for(5s);

  const std::string back = cl.start_node_on(cl.store_of(away), 0, memory);
  ASSERT_FALSE(back.empty());
  uint64_t handed_on = 0;
  settled_with_kctx_removed(cl, *client, {two[0], two[1], back}, kChunks, kBytes, handed_on);
  if (HasFatalFailure()) return;
  EXPECT_EQ(handed_on, 0u) << "the members still remembered the remove";
  EXPECT_EQ(read_all(*client, kChunks, kBytes, kKept), int(kChunks)) << "the context not removed";
}

// Whether `node` is registered again by `deadline`.
bool registered(const cluster::EtcdConfig& etcd, const std::string& node, Deadline deadline) {
  while (Clock::now() < deadline) {
    auto now = cluster::current_members(etcd, deadline_in(2000ms));
    if (now.ok() && std::find(now->begin(), now->end(), node) != now->end()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// A node its cluster drops while it runs (stalled past its lease here, SIGSTOP; cut off
// from etcd alike) misses the removes made meanwhile. When it goes on, it registers
// again; what it held waits behind its fence until the members have handed it their
// removes, as at a restart, so the removed context is neither read from it nor handed
// back to its owners.
TEST_F(EtcdMembership, ANodeItsClusterDroppedWhileItRanServesNothingItHeldUntilHandedTheRemoves) {
  constexpr uint32_t kChunks = 48;
  constexpr size_t kBytes = 4 * 1024;
  Away a;
  remove_while_away(a, kChunks, kBytes, {}, /*paused=*/true);
  if (HasFatalFailure()) return;
  auto& [cl, three, away, client, held_chunks] = a;
  cl.resume(away);
  ASSERT_TRUE(registered(cl.etcd.config(), away, deadline_in(20000ms))) << "the node did not register again";
  // At once, before the members' passes (after their settle): none of its old copies.
  int served = 0;
  for (const auto& [c, bytes] : held_chunks) served += !read_direct(away, c, kBytes).empty();
  EXPECT_EQ(served, 0) << "of " << held_chunks.size() << " chunks of the removed context it held";
  uint64_t handed_on = 0;
  settled_with_kctx_removed(cl, *client, three, kChunks, kBytes, handed_on);
  if (HasFatalFailure()) return;
  EXPECT_GE(handed_on, 1u) << "no member handed the remove to the node that came back";
  auto d = direct(away);
  ASSERT_TRUE(d);
  auto kept_there = d->stat(kKept, deadline_in(5000ms));
  ASSERT_TRUE(kept_there.ok()) << kept_there.status().to_string();
  EXPECT_FALSE(kept_there->empty()) << "the context not removed is served by it again";
  EXPECT_EQ(read_all(*client, kChunks, kBytes, kKept), int(kChunks));
  std::printf("rejoin: %zu copies on the node its cluster dropped, %d served at its return, %llu removes handed "
              "to it\n",
              held_chunks.size(), served, static_cast<unsigned long long>(handed_on));
}

// The same, out longer than the members remember removes (4 s here): none can hand it
// the remove any more, so it drops everything it held before it registers again.
TEST_F(EtcdMembership, ANodeItsClusterDroppedLongerThanRemovesAreRememberedDropsWhatItHeld) {
  constexpr uint32_t kChunks = 24;
  constexpr size_t kBytes = 4 * 1024;
  const std::vector<std::string> memory = {"--remove-memory-s", "4"};
  Away a;
  remove_while_away(a, kChunks, kBytes, memory, /*paused=*/true);
  if (HasFatalFailure()) return;
  auto& [cl, three, away, client, held_chunks] = a;
  std::this_thread::sleep_for(5s);  // until the members have forgotten the remove
  cl.resume(away);
  uint64_t handed_on = 0;
  settled_with_kctx_removed(cl, *client, three, kChunks, kBytes, handed_on);
  if (HasFatalFailure()) return;
  EXPECT_EQ(handed_on, 0u) << "the members still remembered the remove";
  EXPECT_EQ(read_all(*client, kChunks, kBytes, kKept), int(kChunks)) << "the context not removed";
}

// A node is killed holding copies of a context; while it is away the context is
// removed, and more removes push that one out of the members' memory (they remember
// two here), so none hands it to the node when it comes back. Their reports say since
// when they remember every remove: later than the node was last a member (its mark),
// so before its fence lifts it asks the members about each context it held: the one
// no other member holds (the removed one) goes, rather than be served or handed back;
// the other context stays, on every one of its owners.
TEST_F(EtcdMembership, ANodeBackAfterItsRemovesWerePushedOutOfTheMembersMemoryDropsWhatItHeld) {
  constexpr uint32_t kChunks = 24;
  constexpr size_t kBytes = 4 * 1024;
  const std::vector<std::string> bound = {"--max-removes-remembered", "2"};
  Away a;
  remove_while_away(a, kChunks, kBytes, bound);
  if (HasFatalFailure()) return;
  auto& [cl, three, away, client, held_chunks] = a;
  for (const std::string ctx : {"ctx-later-1", "ctx-later-2"}) {
    const Status s = client->remove(ctx, deadline_in(5000ms));
    ASSERT_TRUE(s.ok() || s.code() == StatusCode::not_found) << s.to_string();
  }
  const std::vector<std::string> two = {three[0], three[1]};
  const std::string back = cl.start_node_on(cl.store_of(three[2]), 0, bound);
  ASSERT_FALSE(back.empty());
  const std::vector<std::string> again = {two[0], two[1], back};
  uint64_t handed_on = 0;
  settled_with_kctx_removed(cl, *client, again, kChunks, kBytes, handed_on);
  if (HasFatalFailure()) return;
  EXPECT_EQ(read_all(*client, kChunks, kBytes, kKept), int(kChunks)) << "the context not removed";
  // Every chunk of it on each of its owners again, the returning node among them.
  std::map<std::string, std::map<uint32_t, uint64_t>> on;
  for (const auto& n : again) on[n] = holdings_of(n, kKept);
  int placed = 0;
  for (uint32_t c = 0; c < kChunks; ++c) {
    std::vector<std::string> members = again;
    std::sort(members.begin(), members.end());
    for (const auto& o : owners(members, c, kKept)) placed += on[o].count(c) > 0;
  }
  EXPECT_EQ(placed, int(kChunks * kReplication));
  EXPECT_FALSE(on[back].empty());
}

// Through a client of the settled `three`, kCtx and kKept written (chunks 0 to
// `chunks` - 1); then three[2] stopped (SIGSTOP) holding `held` of kCtx, kCtx removed
// on the two others alone (as a client with the set without it would), and the node
// let go on as soon as etcd has dropped it: it registers again at once. Fatal failures
// end the calling test.
void bounce_while_removed(EtcdCluster& cl, const std::vector<std::string>& three, uint32_t chunks, size_t bytes,
                          std::unique_ptr<storage::Client>& client, std::map<uint32_t, uint64_t>& held) {
  auto connected = cluster::connect(cl.client_config(), deadline_in(5000ms));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  client = std::move(connected).value();
  for (uint32_t c = 0; c < chunks; ++c) {
    ASSERT_TRUE(client->put(kCtx, c, 0, payload(c, bytes), deadline_in(5000ms)).ok());
    ASSERT_TRUE(client->put(kKept, c, 0, payload(c, bytes), deadline_in(5000ms)).ok());
  }
  const std::string away = three[2];
  held = holdings(away);
  ASSERT_FALSE(held.empty());
  cl.pause(away);
  for (const auto& n : {three[0], three[1]}) {
    auto d = direct(n);
    ASSERT_TRUE(d);
    ASSERT_TRUE(d->remove(kCtx, deadline_in(5000ms)).ok()) << n;
  }
  bool dropped = false;
  for (auto until = deadline_in(20000ms); !dropped && Clock::now() < until; std::this_thread::sleep_for(10ms)) {
    auto now = cluster::current_members(cl.etcd.config(), deadline_in(2000ms));
    dropped = now.ok() && std::find(now->begin(), now->end(), away) == now->end();
  }
  cl.resume(away);
  ASSERT_TRUE(dropped) << "etcd did not drop the stopped node";
}

// A node dropped and back before the members' next pass (its lease ran out and it
// registered again within their settle, so their pass sees the same set before and
// after) still missed what a client with the set without it removed meanwhile (made
// here on the two others alone, as such a client would): the members hand those
// removes to it all the same, and it does not serve the context again.
TEST_F(EtcdMembership, ANodeDroppedAndBackBetweenTwoPassesIsHandedTheRemovesItMissed) {
  constexpr uint32_t kChunks = 24;
  constexpr size_t kBytes = 4 * 1024;
  EtcdCluster cl;
  ASSERT_TRUE(cl.etcd.started());
  const auto three = start_settled(cl, 3, 0, /*trimmed=*/true);
  ASSERT_EQ(three.size(), 3u);
  std::unique_ptr<storage::Client> client;
  std::map<uint32_t, uint64_t> held;
  bounce_while_removed(cl, three, kChunks, kBytes, client, held);
  if (HasFatalFailure()) return;
  const std::string away = three[2];
  // The members' reports for the three from before the bounce stand until their pass
  // after it replaces them: wait for the pass that hands the remove on.
  uint64_t handed_on = 0;
  for (auto until = deadline_in(20000ms); handed_on == 0 && Clock::now() < until;) {
    const auto reports = wait_settled(cl.etcd.config(), three, deadline_in(5000ms), /*trimmed=*/true);
    for (const auto& r : reports) handed_on += r.removes_handed_on;
    if (handed_on == 0) std::this_thread::sleep_for(100ms);
  }
  EXPECT_GE(handed_on, 1u) << "no member handed the remove to the node that bounced";
  // Once its fence has lifted (it serves the context not removed), it holds none of
  // the removed one.
  ASSERT_TRUE(serves_kept_again(away)) << "the node that bounced never served what it held again";
  uint64_t again = 0;
  settled_with_kctx_removed(cl, *client, three, kChunks, kBytes, again);
}

// The same bounce, but the members' passes start late (a long settle here; a busy
// member, or one whose watch is behind, alike): their reports for the same three nodes
// from before it left stand meanwhile. Those say nothing of its return, so the node
// serves nothing it held on them: its fence waits for reports made for its new
// registration, by the passes that hand it the remove.
TEST_F(EtcdMembership, ANodeBackBeforeTheMembersPassesServesNothingItHeldOnTheirOlderReports) {
  constexpr uint32_t kChunks = 24;
  constexpr size_t kBytes = 4 * 1024;
  EtcdCluster cl;
  ASSERT_TRUE(cl.etcd.started());
  const std::vector<std::string> slow = {"--rebalance-settle-ms", "4000"};
  // The node that bounces serves /metrics: its fence gauge is read along the way.
  const std::string metrics = "127.0.0.1:" + std::to_string(kvstream::transport::test_util::free_port());
  const std::vector<std::string> three = {cl.start_node(0, slow), cl.start_node(0, slow),
                                          cl.start_node(0, {"--metrics", metrics})};
  for (const auto& n : three) ASSERT_FALSE(n.empty());
  const auto fenced = [&] {
    namespace tu = kvstream::transport::test_util;
    return tu::sample(tu::http_exchange(metrics, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
                      "kvstream_node_fenced");
  };
  ASSERT_FALSE(wait_settled(cl.etcd.config(), three, deadline_in(60000ms), /*trimmed=*/true).empty());
  EXPECT_EQ(fenced(), 0) << "a member that has not been away serves what it holds";
  std::unique_ptr<storage::Client> client;
  std::map<uint32_t, uint64_t> held;
  bounce_while_removed(cl, three, kChunks, kBytes, client, held);
  if (HasFatalFailure()) return;
  const std::string away = three[2];
  ASSERT_TRUE(registered(cl.etcd.config(), away, deadline_in(20000ms))) << "the node did not register again";
  // From its return until a member's pass has handed it the remove, the most of the
  // removed context's chunks it served at one look.
  int served = 0, looks_fenced = 0, looks = 0;
  uint64_t handed_on = 0;
  for (auto until = deadline_in(30000ms); handed_on == 0 && Clock::now() < until;) {
    int now = 0;
    ++looks, looks_fenced += fenced() == 1;
    for (const auto& [c, bytes] : held) now += !read_direct(away, c, kBytes).empty();
    served = std::max(served, now);
    auto reports = cluster::migration_reports(cl.etcd.config(), deadline_in(2000ms));
    for (const auto& r : reports.ok() ? *reports : std::vector<cluster::MigrationReport>{})
      if (r.node != away) handed_on += r.removes_handed_on;
    if (handed_on == 0) std::this_thread::sleep_for(50ms);
  }
  ASSERT_GE(handed_on, 1u) << "no member handed the remove to the node that bounced";
  EXPECT_EQ(served, 0) << "of " << held.size() << " chunks of the removed context it held";
  EXPECT_EQ(looks_fenced, looks) << "its fence gauge said 1 while it served nothing it held";
  ASSERT_TRUE(serves_kept_again(away)) << "the node that bounced never served what it held again";
  EXPECT_EQ(fenced(), 0) << "the gauge after the fence lifted";
  uint64_t again = 0;
  settled_with_kctx_removed(cl, *client, three, kChunks, kBytes, again);
  std::printf("late passes: %zu copies on the node that bounced, %d served before the members handed it the "
              "remove; its fence gauge 1 at %d of %d looks\n",
              held.size(), served, looks_fenced, looks);
}

}  // namespace
}  // namespace kvstream::test_etcd_removes

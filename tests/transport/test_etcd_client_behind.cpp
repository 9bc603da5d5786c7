// A replicated client whose member set is behind the nodes' (its etcd watch on a
// member that froze): a chunk that moved to a node it does not know, and whose copy
// on the old owner went once the rebalance was done, is still found (the old owner's
// not_found names its newer member set; the client reads the set again and asks the
// new owner). docs/storage-backends.md, "Reads from a client behind".
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "storage/cluster/membership_watch.hpp"
#include "storage/owner_hint.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/transport/etcd_cluster.hpp"
#include "tests/transport/etcd_members.hpp"

namespace kvstream::test_etcd_client_behind {

using namespace kvstream::test_etcd;

TEST(EtcdClientBehind, AGetFindsAChunkThatMovedToANodeItHasNotSeenAndLeftItsOldOwner) {
  if (EtcdServer::program().empty()) GTEST_SKIP() << "etcd is not installed (Debian package etcd-server)";
  constexpr uint32_t kChunks = 48;
  constexpr size_t kBytes = 4096;
  test_util::EtcdMembers etcd("kvs-etcd-behind", 3);
  ASSERT_TRUE(etcd.started());
  kvstream::testing::TempDir dir("kvs-behind-nodes");
  write_secrets(dir.path() / "secrets.json");
  // The nodes use members 1 and 2; R = 1, so a chunk that moved has no copy left on
  // an owner the client knows once the old owner dropped it.
  std::vector<std::unique_ptr<kvstream::testing::NodeProcess>> nodes;
  auto start_node = [&]() -> std::string {
    auto p = std::make_unique<kvstream::testing::NodeProcess>();
    const auto args = node_args((dir.path() / fmt::format("n{}", nodes.size())).string(), dir.path() / "secrets.json",
                                {etcd.url(1), etcd.url(2)}, 1);
    if (!p->start(KVSTREAM_SERVER_BIN, args, "warn")) return {};
    nodes.push_back(std::move(p));
    return nodes.back()->address();
  };
  const auto nodes_etcd = etcd.config({1, 2});
  const std::string a = start_node(), b = start_node();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  ASSERT_FALSE(wait_settled(nodes_etcd, {a, b}, deadline_in(30000ms)).empty());

  // The client follows the set through member 0 first (its watch is there).
  cluster::ClusterConfig cc;
  cc.etcd = etcd.config({0, 1});
  cc.etcd.request_timeout = 1000ms;
  cc.replication = 1;
  cc.name_space = kNs, cc.secret = kSecret;
  auto client = cluster::connect(cc, deadline_in(5000ms));
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  for (uint32_t k = 0; k < kChunks; ++k)
    ASSERT_TRUE((*client)->put(kCtx, k, 0, payload(k, kBytes), deadline_in(5000ms)).ok()) << k;

  // Member 0 freezes: the client's watch stays open and says nothing from here on. A
  // third node joins; the chunks it owns are copied to it and dropped where they were.
  etcd.pause(0);
  const std::string c = start_node();
  ASSERT_FALSE(c.empty());
  const auto reports = wait_settled(nodes_etcd, {a, b, c}, deadline_in(30000ms), /*trimmed=*/true);
  ASSERT_FALSE(reports.empty());
  const auto moved = holdings(c);
  ASSERT_FALSE(moved.empty()) << "no chunk moved to the node that joined";
  for (const auto& old : {a, b})
    for (const auto& [chunk, bytes] : holdings(old))
      ASSERT_FALSE(moved.contains(chunk)) << "chunk " << chunk << " still on " << old << ": nothing to miss";

  // Every chunk reads back through the client, the moved ones included.
  EXPECT_EQ(read_all(**client, kChunks, kBytes), int(kChunks)) << moved.size() << " chunks moved to the new node";
  // And later reads of those go to the new owner straight away: the set is current.
  EXPECT_EQ(read_all(**client, kChunks, kBytes), int(kChunks));
  etcd.resume(0);

  // What the nodes say with a not_found: the chunk's owner names no member set (a
  // chunk stored nowhere costs a client no read of etcd), any other node its set's
  // revision.
  const uint32_t absent = kChunks + 7;
  const std::string owner = owners({a, b, c}, absent).front();  // R = 1: the first on the ring
  std::vector<std::byte> buf(kBytes);
  for (const auto& n : {a, b, c}) {
    auto node = direct(n);
    ASSERT_TRUE(node);
    auto region = node->register_memory(buf.data(), buf.size());
    ASSERT_TRUE(region.ok());
    EXPECT_EQ(node->get(kCtx, absent, 0, *region, 0, buf.size(), deadline_in(5000ms)).status().code(),
              StatusCode::not_found);
    EXPECT_EQ(storage::members_revision_hint(*node) > 0, n != owner) << n << (n == owner ? " (the owner)" : "");
  }
}

// MembershipWatch::catch_up brings the set in from a read while the watch's stream is
// behind (its member frozen); when the stream catches up, the events the read covered
// are skipped: a node that registered again meanwhile is one leave and one join, not
// two (each a pass on the nodes, and a connection let go and made again on clients).
TEST(MembershipWatch, EventsACatchUpReadBroughtInAreNotReportedAgain) {
  if (EtcdServer::program().empty()) GTEST_SKIP() << "etcd is not installed (Debian package etcd-server)";
  test_util::EtcdMembers etcd("kvs-etcd-catch-up", 3);
  ASSERT_TRUE(etcd.started());
  auto writer = cluster::EtcdClient::create(etcd.config({1, 2}));
  ASSERT_TRUE(writer.ok()) << writer.status().to_string();
  // A member frozen may have been the leader: the others elect one meanwhile.
  const auto retried = [](const auto& op) {
    Status s;
    for (int i = 0; i < 100 && !(s = op()).ok(); ++i) std::this_thread::sleep_for(100ms);
    return s;
  };
  const std::string prefix = "/kvs-test/nodes/";
  int64_t lease = 0;
  const auto registered = [&](const std::string& name) {
    return retried([&]() -> Status {
      auto l = writer->grant(60s, deadline_in(2000ms), {});
      if (!l.ok()) return l.status();
      lease = *l;
      return writer->put(prefix + name, name, lease, deadline_in(2000ms), {});
    });
  };
  ASSERT_TRUE(registered("a").ok());

  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<std::string>> seen;  // each set reported, in order
  auto cfg = etcd.config({0, 1});
  cfg.request_timeout = 1000ms;
  auto follower = cluster::EtcdClient::create(cfg);
  ASSERT_TRUE(follower.ok());
  auto watch = cluster::MembershipWatch::start(
      std::move(follower).value(),
      [&](const cluster::MemberSet& m) {
        std::lock_guard lock(mu);
        seen.push_back(m.nodes);
        cv.notify_all();
      },
      deadline_in(5000ms));
  ASSERT_TRUE(watch.ok()) << watch.status().to_string();
  ASSERT_EQ((*watch)->members().nodes, std::vector<std::string>{"a"});

  etcd.pause(0);  // the watch's member: its stream says nothing from here on
  ASSERT_TRUE(retried([&] { return writer->revoke(lease, deadline_in(2000ms), {}); }).ok());
  ASSERT_TRUE(registered("a").ok());  // the same node again, under a new registration
  ASSERT_TRUE((*watch)->catch_up(deadline_in(10000ms)).ok());
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(seen, (std::vector<std::vector<std::string>>{{}, {"a"}})) << "registered again: out, then in";
  }
  etcd.resume(0);
  ASSERT_TRUE(registered("b").ok());  // a change after the read: the stream brings it
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 30s, [&] { return !seen.empty() && seen.back().size() == 2; }))
      << "the watch never reported the node that joined after the read";
  EXPECT_EQ(seen, (std::vector<std::vector<std::string>>{{}, {"a"}, {"a", "b"}}))
      << "the events before the read reported again";
}

}  // namespace kvstream::test_etcd_client_behind

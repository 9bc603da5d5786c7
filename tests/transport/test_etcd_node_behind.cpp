// A storage node whose etcd watch is stuck (its member frozen: the stream stays open
// and silent, and TCP keepalives do not notice a stopped process) learns of a change
// from its clients, whose requests name a newer member set (docs/protocol.md, "Member
// sets"): it reads the set again, rebalances for it, and its watch starts again on a
// member that answers, so the next change reaches it without any client's word. Its
// lease stays renewed meanwhile (etcd calls share their deadline among endpoints).
#include <gtest/gtest.h>

#include "tests/transport/etcd_cluster.hpp"
#include "tests/transport/etcd_members.hpp"

namespace kvstream::test_etcd_node_behind {

using namespace kvstream::test_etcd;

TEST(EtcdNodeBehind, ANodeWhoseWatchIsStuckCatchesUpOnItsClientsWordAndWatchesAgain) {
  if (EtcdServer::program().empty()) GTEST_SKIP() << "etcd is not installed (Debian package etcd-server)";
  constexpr uint32_t kChunks = 48;
  constexpr size_t kBytes = 4096;
  test_util::EtcdMembers etcd("kvs-etcd-node-behind", 3);
  ASSERT_TRUE(etcd.started());
  NodeGroup nodes("kvs-node-behind");
  // Node `a` follows the set through member 0 first (its watch is there), the others
  // and the client through members 1 and 2.
  const std::string a = nodes.start({etcd.url(0), etcd.url(1)}, 1);
  const std::string b = nodes.start({etcd.url(1), etcd.url(2)}, 1);
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  const auto live = etcd.config({1, 2});
  ASSERT_FALSE(wait_settled(live, {a, b}, deadline_in(30000ms)).empty());
  cluster::ClusterConfig cc;
  cc.etcd = live;
  cc.replication = 1;
  cc.name_space = kNs, cc.secret = kSecret;
  auto client = cluster::connect(cc, deadline_in(5000ms));
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  for (uint32_t k = 0; k < kChunks; ++k)
    ASSERT_TRUE((*client)->put(kCtx, k, 0, payload(k, kBytes), deadline_in(5000ms)).ok()) << k;

  // Member 0 freezes: a's watch says nothing from here on. A third node joins; b
  // rebalances for it, a does not know of it.
  etcd.pause(0);
  // A call whose first endpoint is the frozen member leaves the next one time to
  // answer within its deadline (a renewal of a's lease must, or a is dropped): the
  // deadline is shared among the endpoints, not spent on the first.
  {
    // (Once the live members have a leader: the frozen one may have been it.)
    auto live_only = cluster::EtcdClient::create(etcd.config({1, 2}));
    ASSERT_TRUE(live_only.ok());
    for (int i = 0; i < 100 && !live_only->range_prefix("/kvs-test/nodes/", deadline_in(2000ms), {}).ok(); ++i)
      std::this_thread::sleep_for(100ms);
    auto first_frozen = cluster::EtcdClient::create(etcd.config({0, 1}));
    ASSERT_TRUE(first_frozen.ok());
    auto r = first_frozen->range_prefix("/kvs-test/nodes/", deadline_in(2000ms), {});
    EXPECT_TRUE(r.ok()) << r.status().to_string();
  }
  const std::string c = nodes.start({etcd.url(1), etcd.url(2)}, 1);
  ASSERT_FALSE(c.empty());
  ASSERT_TRUE(wait_settled(live, {a, b, c}, deadline_in(3000ms)).empty()) << "a saw the join: nothing to catch up";

  // The client's reads reach a, naming the set with c; a reads the set, copies c's
  // chunks to it and drops its own copies once every member is done.
  EXPECT_EQ(read_all(**client, kChunks, kBytes), int(kChunks));
  ASSERT_FALSE(wait_settled(live, {a, b, c}, deadline_in(20000ms), /*trimmed=*/true).empty())
      << "a never rebalanced for the set with c";
  const auto on_a = holdings(a);
  for (const auto& [chunk, bytes] : holdings(c)) EXPECT_FALSE(on_a.contains(chunk)) << chunk << " left on a";
  EXPECT_EQ(read_all(**client, kChunks, kBytes), int(kChunks));

  // No client speaks from here on; a fourth node joins: a's watch, started again on a
  // member that answers, brings it (member 0 is still frozen).
  client->reset();
  const std::string d = nodes.start({etcd.url(1), etcd.url(2)}, 1);
  ASSERT_FALSE(d.empty());
  EXPECT_FALSE(wait_settled(live, {a, b, c, d}, deadline_in(20000ms), /*trimmed=*/true).empty())
      << "a's watch is still where it was stuck";
  etcd.resume(0);
}

}  // namespace kvstream::test_etcd_node_behind

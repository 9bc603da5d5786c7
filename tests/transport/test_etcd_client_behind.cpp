// A replicated client whose member set is behind the nodes' (its etcd watch on a
// member that froze): a chunk that moved to a node it does not know, and whose copy
// on the old owner went once the rebalance was done, is still found (the old owner's
// not_found names its newer member set; the client reads the set again and asks the
// new owner). docs/storage-backends.md, "Reads from a client behind".
#include <gtest/gtest.h>

#include <fstream>

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
  std::ofstream(dir.path() / "secrets.json") << fmt::format("{{\"{}\": \"{}\"}}", kNs, kSecret);
  // The nodes use members 1 and 2; R = 1, so a chunk that moved has no copy left on
  // an owner the client knows once the old owner dropped it.
  std::vector<std::unique_ptr<kvstream::testing::NodeProcess>> nodes;
  auto start_node = [&]() -> std::string {
    auto p = std::make_unique<kvstream::testing::NodeProcess>();
    const std::vector<std::string> args = {
        "--listen", "127.0.0.1:0", "--dir", (dir.path() / fmt::format("n{}", nodes.size())).string(),
        "--secrets", (dir.path() / "secrets.json").string(), "--etcd", etcd.url(1), "--etcd", etcd.url(2),
        "--etcd-prefix", "/kvs-test/", "--replication", "1", "--lease-ttl-s", "2"};
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

}  // namespace kvstream::test_etcd_client_behind

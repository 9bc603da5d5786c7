// Replicated clients whose member set is behind the nodes' (their etcd watch on a
// member that froze), after a node joined and took chunks that left their old owner
// once the rebalance was done: every call still reaches the node they did not know.
// Each node answers a request that names an older set than its own saying so; the
// client reads the set again and asks anew (gets: the chunk's owners under it; calls
// to every node: the members it lacked). docs/protocol.md, "Member sets".
#include <gtest/gtest.h>

#include <condition_variable>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include "storage/cluster/membership_watch.hpp"
#include "storage/members_link.hpp"
#include "tests/transport/etcd_cluster.hpp"
#include "tests/transport/etcd_members.hpp"

namespace kvstream::test_etcd_client_behind {

using namespace kvstream::test_etcd;

// Single-chunk contexts beside kCtx: a third of them move whole to the node that
// joins, so a listing that misses it misses them.
std::string solo(uint32_t i) { return fmt::format("solo-{}", i); }

TEST(EtcdClientBehind, EveryCallReachesTheNodeItHasNotSeenWhereChunksMovedAndLeftTheirOldOwner) {
  if (EtcdServer::program().empty()) GTEST_SKIP() << "etcd is not installed (Debian package etcd-server)";
  constexpr uint32_t kChunks = 48, kSolos = 24;
  constexpr size_t kBytes = 4096;
  test_util::EtcdMembers etcd("kvs-etcd-behind", 3);
  ASSERT_TRUE(etcd.started());
  // The nodes use members 1 and 2; R = 1, so a chunk that moved has no copy left on
  // an owner the clients know once the old owner dropped it.
  NodeGroup nodes("kvs-behind-nodes");
  auto start_node = [&] { return nodes.start({etcd.url(1), etcd.url(2)}, 1); };
  const auto nodes_etcd = etcd.config({1, 2});
  const std::string a = start_node(), b = start_node();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  ASSERT_FALSE(wait_settled(nodes_etcd, {a, b}, deadline_in(30000ms)).empty());

  // One client per call under test (a call that reads the set again brings its client
  // up to date), each following the set through member 0 first (its watch is there).
  cluster::ClusterConfig cc;
  cc.etcd = etcd.config({0, 1});
  cc.etcd.request_timeout = 1000ms;
  cc.replication = 1;
  cc.name_space = kNs, cc.secret = kSecret;
  enum { kGets, kStat, kList, kUsage, kPut, kRemove, kClients };
  std::vector<std::unique_ptr<storage::Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    auto client = cluster::connect(cc, deadline_in(5000ms));
    ASSERT_TRUE(client.ok()) << client.status().to_string();
    clients.push_back(std::move(client).value());
  }
  for (uint32_t k = 0; k < kChunks; ++k)
    ASSERT_TRUE(clients[kGets]->put(kCtx, k, 0, payload(k, kBytes), deadline_in(5000ms)).ok()) << k;
  for (uint32_t i = 0; i < kSolos; ++i)
    ASSERT_TRUE(clients[kGets]->put(solo(i), 0, 0, payload(i, kBytes), deadline_in(5000ms)).ok()) << i;

  // Member 0 freezes: the clients' watches stay open and say nothing from here on. A
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
  std::set<std::string> solos_moved;
  for (uint32_t i = 0; i < kSolos; ++i)
    if (!holdings_of(c, solo(i)).empty()) solos_moved.insert(solo(i));
  ASSERT_FALSE(solos_moved.empty()) << "no single-chunk context moved to the node that joined";

  // Every chunk reads back, the moved ones included; and later reads of those go to
  // the new owner straight away: the set is current.
  EXPECT_EQ(read_all(*clients[kGets], kChunks, kBytes), int(kChunks)) << moved.size() << " chunks moved";
  EXPECT_EQ(read_all(*clients[kGets], kChunks, kBytes), int(kChunks));

  // A stat names every chunk, the moved ones included.
  auto stat = clients[kStat]->stat(kCtx, deadline_in(10000ms));
  ASSERT_TRUE(stat.ok()) << stat.status().to_string();
  EXPECT_EQ(stat->size(), size_t(kChunks)) << moved.size() << " chunks moved";
  // A listing and a usage listing name the contexts that moved whole.
  auto listed = clients[kList]->list(deadline_in(10000ms));
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  size_t solos_listed = 0;
  for (const auto& name : *listed) solos_listed += name.starts_with("solo-");
  EXPECT_EQ(solos_listed, size_t(kSolos)) << solos_moved.size() << " moved whole";
  auto used = clients[kUsage]->usage("solo-", deadline_in(10000ms));
  ASSERT_TRUE(used.ok()) << used.status().to_string();
  EXPECT_EQ(used->size(), size_t(kSolos)) << solos_moved.size() << " moved whole";

  // A write of a chunk that moved reaches its owner before it is acknowledged: a
  // client whose set is current reads it at once (not the copy made before it).
  const uint32_t rewritten = moved.begin()->first;
  const auto fresh = payload(rewritten + 1000, kBytes);
  ASSERT_TRUE(clients[kPut]->put(kCtx, rewritten, 0, fresh, deadline_in(10000ms)).ok());
  {
    std::vector<std::byte> buf(kBytes);
    auto region = clients[kGets]->register_memory(buf.data(), buf.size());
    ASSERT_TRUE(region.ok());
    auto got = clients[kGets]->get(kCtx, rewritten, 0, *region, 0, buf.size(), deadline_in(5000ms));
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(buf == fresh) << "chunk " << rewritten << ": the write before the put read back";
  }

  // A remove reaches the node that holds what moved: nothing of the context is read
  // back afterwards, through a client whose set is current or from that node.
  ASSERT_TRUE(clients[kRemove]->remove(kCtx, deadline_in(10000ms)).ok());
  EXPECT_TRUE(holdings(c).empty()) << holdings(c).size() << " chunks still on the node that joined";
  EXPECT_EQ(read_all(*clients[kGets], kChunks, kBytes), 0);
  etcd.resume(0);

  // What the nodes answer a request that names a member set: each says its own is
  // newer than one older than any it saw (a get of a chunk stored nowhere, a stat, a
  // listing alike), and none says so of one newer than its own.
  auto backend = transport::create_backend(transport::BackendConfig{});
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  const std::shared_ptr<transport::Backend> shared = std::move(backend).value();
  std::vector<std::byte> buf(kBytes);
  for (const int64_t named : {int64_t(1), std::numeric_limits<int64_t>::max() / 2})
    for (const auto& n : {a, b, c}) {
      auto link = std::make_shared<storage::MembersLink>();
      link->set_revision(named);
      std::atomic<int> said_newer{0};
      link->on_newer = [&](int64_t told) { said_newer += told == named + 1; };
      storage::ClientConfig nc;
      nc.address = n, nc.name_space = kNs, nc.secret = kSecret;
      auto node = storage::connect_following_members(nc, shared, link, deadline_in(5000ms));
      ASSERT_TRUE(node.ok()) << node.status().to_string();
      auto region = (*node)->register_memory(buf.data(), buf.size());
      ASSERT_TRUE(region.ok());
      for (int call = 0; call < 3; ++call) {
        const StatusCode code =
            call == 0   ? (*node)->get(kCtx, kChunks + 7, 0, *region, 0, buf.size(), deadline_in(5000ms)).status().code()
            : call == 1 ? (*node)->stat(solo(0), deadline_in(5000ms)).status().code()
                        : (*node)->list(deadline_in(5000ms)).status().code();
        EXPECT_TRUE(code == StatusCode::ok || code == StatusCode::not_found) << n << " call " << call;
        EXPECT_EQ(said_newer.load(), named == 1 ? call + 1 : 0) << n << " call " << call << ", named " << named;
      }
      node->reset();  // before the counter goes (its receiver calls on_newer)
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

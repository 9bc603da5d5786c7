// etcd membership (issue 21): storage nodes (kvstream-server processes) register in an
// etcd the test starts (etcd_cluster.hpp), the replicated client follows the member set, and after a join
// or a crash the nodes copy chunks to their new owners until every chunk has R
// replicas again. Placement is checked against the ring exactly; the moved share is
// reported; perf/etcd-rebalance.sh measures what a join leaves the nodes holding.
// Removes across a node's absence are in test_etcd_removes.cpp.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <thread>
#include <set>

#include "tests/support/hang_guard.hpp"
#include "storage/cluster/membership_watch.hpp"
#include "tests/transport/etcd_cluster.hpp"
#include "tests/transport/etcd_members.hpp"

namespace kvstream::test_etcd_membership {

using namespace kvstream::test_etcd;

namespace {

TEST_F(EtcdMembership, ClientFollowsNodesThatRegisterAndLeave) {
  EtcdCluster cl;
  ASSERT_TRUE(cl.etcd.started());
  const std::string a = cl.start_node(), b = cl.start_node();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  auto members = cluster::current_members(cl.etcd.config(), deadline_in(2000ms));
  ASSERT_TRUE(members.ok()) << members.status().to_string();
  EXPECT_EQ(*members, (std::vector<std::string>{std::min(a, b), std::max(a, b)}));

  auto client = cluster::connect(cl.client_config(), deadline_in(5000ms));
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  ASSERT_TRUE((*client)->put(kCtx, 0, 0, payload(0, 4096), deadline_in(5000ms)).ok());
  EXPECT_EQ(read_all(**client, 1, 4096), 1);

  // A third node joins: the client places chunks on it (after it has seen it).
  const std::string c = cl.start_node();
  ASSERT_FALSE(c.empty());
  ASSERT_FALSE(wait_settled(cl.etcd.config(), {a, b, c}, deadline_in(30000ms)).empty());
  EXPECT_TRUE(places_on(**client, {a, b, c}, c)) << "the client never placed a chunk on the node that joined";

  // Membership of a node that crashed ends with its lease.
  cl.kill(b);
  for (int i = 0; i < 100; ++i) {
    members = cluster::current_members(cl.etcd.config(), deadline_in(2000ms));
    if (members.ok() && members->size() == 2) break;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(members.ok());
  EXPECT_EQ(*members, (std::vector<std::string>{std::min(a, c), std::max(a, c)}));
}

// etcd down: clients and nodes keep the member set they have (fetches go on); etcd
// back: the watch resumes and a node that registers afterwards is seen.
TEST_F(EtcdMembership, SurvivesAnEtcdRestart) {
  EtcdCluster cl;
  ASSERT_TRUE(cl.etcd.started());
  const std::string a = cl.start_node(), b = cl.start_node();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  ASSERT_FALSE(wait_settled(cl.etcd.config(), {a, b}, deadline_in(30000ms)).empty());
  auto client = cluster::connect(cl.client_config(), deadline_in(5000ms));
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  for (uint32_t k = 0; k < 20; ++k) ASSERT_TRUE((*client)->put(kCtx, k, 0, payload(k, 4096), deadline_in(5000ms)).ok());

  cl.etcd.kill();
  EXPECT_EQ(read_all(**client, 20, 4096), 20) << "reads need the nodes, not etcd";
  EXPECT_TRUE((*client)->put(kCtx, 20, 0, payload(20, 4096), deadline_in(5000ms)).ok());
  ASSERT_TRUE(cl.etcd.restart());
  // The nodes renew their leases again (or register anew); a third node joins and
  // the client, whose watch broke, learns of it.
  const std::string c = cl.start_node();
  ASSERT_FALSE(c.empty());
  ASSERT_FALSE(wait_settled(cl.etcd.config(), {a, b, c}, deadline_in(30000ms)).empty());
  EXPECT_TRUE(places_on(**client, {a, b, c}, c)) << "the client's watch did not resume after etcd came back";
  EXPECT_EQ(read_all(**client, 21, 4096), 21);
}

// Issue 21's figures: a fourth node joining three takes the chunks the ring gives it
// and nothing moves between the old nodes; a node killed: every chunk back to R
// replicas; 0 chunks lost, 0 wrong, reads served throughout.
TEST_F(EtcdMembership, JoinAndCrashRebalanceToRReplicasLosingNothing) {
  // Many small chunks: the share a join moves is then the ring's, not the keys' luck.
  constexpr uint32_t kChunks = 960;
  constexpr size_t kBytes = 4 * 1024;
  EtcdCluster cl;
  ASSERT_TRUE(cl.etcd.started());
  const auto three = start_settled(cl, 3, /*rate_mb=*/1);
  ASSERT_EQ(three.size(), 3u);
  auto client = cluster::connect(cl.client_config(), deadline_in(5000ms));
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  for (uint32_t c = 0; c < kChunks; ++c)
    ASSERT_TRUE((*client)->put(kCtx, c, 0, payload(c, kBytes), deadline_in(5000ms)).ok()) << c;
  std::map<std::string, std::map<uint32_t, uint64_t>> before;
  uint64_t stored = 0;
  for (const auto& a : three) {
    before[a] = holdings(a);
    stored += before[a].size() * kBytes;
  }
  ASSERT_EQ(stored, uint64_t(kChunks) * kReplication * kBytes);
  // A use mark on every holder (the cluster client tells every node); the rebalance
  // carries it to the new owner with the context's objects.
  const storage::ContextTouch mark{kCtx, 3};
  ASSERT_TRUE((*client)->touch(std::span(&mark, 1), 4242, deadline_in(5000ms)).ok());

  // Join: copying runs at 1 MiB/s, so the reads below overlap it (and fall back to
  // the old owners for chunks not copied yet).
  const std::string d = cl.start_node(1);
  ASSERT_FALSE(d.empty());
  std::vector<std::string> four = three;
  four.push_back(d);
  EXPECT_EQ(read_all(**client, kChunks, kBytes), int(kChunks)) << "a read failed during the rebalance";
  const auto reports = wait_settled(cl.etcd.config(), four, deadline_in(60000ms), /*trimmed=*/true);
  ASSERT_FALSE(reports.empty()) << "the rebalance after the join did not finish";
  uint64_t copied = 0, trimmed = 0;
  for (const auto& r : reports) {
    copied += r.bytes_copied, trimmed += r.bytes_trimmed;
    EXPECT_EQ(r.objects_kept, 0u) << r.node;
  }
  const auto on_d = holdings(d);
  uint64_t expected_on_d = 0;
  for (uint32_t c = 0; c < kChunks; ++c) {
    const auto o = owners(four, c);
    const bool owns = std::find(o.begin(), o.end(), d) != o.end();
    expected_on_d += owns;
    EXPECT_EQ(on_d.count(c) > 0, owns) << "chunk " << c;
  }
  EXPECT_EQ(on_d.size(), expected_on_d);
  EXPECT_EQ(copied, on_d.size() * kBytes) << "bytes went somewhere other than the new node";
  {
    storage::ClientConfig cc;
    cc.address = d, cc.name_space = kNs, cc.secret = kSecret;
    auto direct = storage::Client::connect(cc, deadline_in(5000ms));
    ASSERT_TRUE(direct.ok()) << direct.status().to_string();
    auto usage = (*direct)->usage(kCtx, deadline_in(5000ms));
    ASSERT_TRUE(usage.ok()) << usage.status().to_string();
    ASSERT_EQ(usage->size(), 1u);
    EXPECT_EQ((*usage)[0].used, 4242u) << "the use mark did not travel with the context";
    EXPECT_EQ((*usage)[0].depth, 3u);
  }
  // Each chunk the new node took leaves exactly one old owner, which dropped its copy
  // once every member had copied: R copies of everything, nothing else moved.
  uint64_t held = on_d.size() * kBytes;
  for (const auto& a : three) {
    std::map<uint32_t, uint64_t> kept;
    for (const auto& [c, b] : before[a])
      if (const auto o = owners(four, c); std::find(o.begin(), o.end(), a) != o.end()) kept[c] = b;
    EXPECT_EQ(holdings(a), kept) << "old node " << a << " holds other than the chunks it still owns";
    held += kept.size() * kBytes;
  }
  EXPECT_EQ(held, stored) << "not R copies of every chunk after the trim";
  EXPECT_EQ(trimmed, copied) << "the bytes dropped are not those the new node took";
  const double share = double(copied) / double(stored);
  ::testing::Test::RecordProperty("join_moved_share", fmt::format("{:.3f}", share));
  std::printf("join: %llu of %llu stored bytes moved to the new node (%.3f; a quarter is 0.25)\n",
              static_cast<unsigned long long>(copied), static_cast<unsigned long long>(stored), share);
  EXPECT_GT(share, 0.15);
  EXPECT_LT(share, 0.35);

  // Crash: the killed node's chunks get a second replica again from the survivors.
  const std::string victim = three[1];
  const auto t0 = Clock::now();
  cl.kill(victim);
  std::vector<std::string> survivors;
  for (const auto& a : four)
    if (a != victim) survivors.push_back(a);
  EXPECT_EQ(read_all(**client, kChunks, kBytes), int(kChunks)) << "a read failed after the crash";
  ASSERT_FALSE(wait_settled(cl.etcd.config(), survivors, deadline_in(60000ms)).empty())
      << "the rebalance after the crash did not finish";
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::map<std::string, std::map<uint32_t, uint64_t>> after;
  for (const auto& a : survivors) after[a] = holdings(a);
  for (uint32_t c = 0; c < kChunks; ++c) {
    int replicas = 0;
    for (const auto& a : survivors) replicas += after[a].count(c) > 0;
    EXPECT_GE(replicas, int(kReplication)) << "chunk " << c;
    for (const auto& o : owners(survivors, c)) EXPECT_TRUE(after[o].count(c)) << "chunk " << c << " owner " << o;
  }
  EXPECT_EQ(read_all(**client, kChunks, kBytes), int(kChunks));
  ::testing::Test::RecordProperty("crash_back_to_r_seconds", fmt::format("{:.2f}", secs));
  std::printf("crash: every chunk back to %u replicas %.2f s after the kill (lease TTL 2 s)\n", kReplication, secs);
}

// Writes of a client whose member set is behind (its etcd watch cut off), made long
// after every rebalance finished, to a node that does not own their chunks: k1 also on
// its owners at the same version, k2 at a newer version than its owners', k3 on that
// node alone. With no membership change, the node sees the writes are not its own,
// drops k1, and hands k2 and k3 to their owners before it drops them; a write of a
// chunk it owns stays. The owners then serve the newest write of each chunk.
TEST_F(EtcdMembership, AWriteFromAClientBehindReachesItsOwners) {
  EtcdCluster cl;
  ASSERT_TRUE(cl.etcd.started());
  const auto three = start_settled(cl, 3, 0, /*trimmed=*/true);
  ASSERT_EQ(three.size(), 3u);
  const std::string a = three[0];
  std::vector<uint32_t> strays;
  std::optional<uint32_t> own;
  for (uint32_t k = 0; k < 1000 && (strays.size() < 3 || !own); ++k) {
    const auto o = owners(three, k);
    if (std::find(o.begin(), o.end(), a) != o.end()) own = own.value_or(k);
    else if (strays.size() < 3) strays.push_back(k);
  }
  ASSERT_EQ(strays.size(), 3u);
  ASSERT_TRUE(own);
  const uint32_t k1 = strays[0], k2 = strays[1], k3 = strays[2];
  constexpr size_t kBytes = 4096;
  // The newer write of k2 differs from the older one, so a read tells them apart.
  const auto older = [](uint32_t k) { return payload(k, kBytes); };
  const auto newer = [](uint32_t k) { return payload(k + 100000, kBytes); };
  for (const auto& o : owners(three, k1)) {
    auto c = direct(o);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->put_versioned(kCtx, k1, 0, older(k1), 100, deadline_in(5000ms)).ok());
    ASSERT_TRUE(c->put_versioned(kCtx, k2, 0, older(k2), 100, deadline_in(5000ms)).ok());
  }
  {
    auto c = direct(a);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->put_versioned(kCtx, k1, 0, older(k1), 100, deadline_in(5000ms)).ok());
    ASSERT_TRUE(c->put_versioned(kCtx, k2, 0, newer(k2), 200, deadline_in(5000ms)).ok());
    ASSERT_TRUE(c->put_versioned(kCtx, k3, 0, older(k3), 100, deadline_in(5000ms)).ok());
    ASSERT_TRUE(c->put(kCtx, *own, 0, older(*own), deadline_in(5000ms)).ok());
  }
  // Until a reports the three copies gone (or the deadline: a failure below). The
  // writes may be looked at in more than one go; the counts add up.
  cluster::MigrationReport on_a;
  for (const auto until = deadline_in(30000ms); Clock::now() < until; std::this_thread::sleep_for(100ms)) {
    auto reports = cluster::migration_reports(cl.etcd.config(), deadline_in(2000ms));
    if (!reports.ok()) continue;
    for (const auto& r : *reports)
      if (r.node == a) on_a = r;
    if (on_a.objects_trimmed >= 3) break;
  }
  EXPECT_EQ(on_a.objects_trimmed, 3u);
  EXPECT_EQ(on_a.objects_handed_over, 2u * kReplication) << "k2 and k3, each to both owners";
  EXPECT_EQ(on_a.bytes_handed_over, 2u * kReplication * kBytes);
  EXPECT_EQ(on_a.objects_kept, 0u);
  std::vector<std::string> sorted = three;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(on_a.members, sorted) << "a membership change happened";
  const auto held = holdings(a);
  EXPECT_EQ(held.size(), 1u) << "a kept copies of chunks it does not own";
  EXPECT_EQ(held.count(*own), 1u) << "a dropped a chunk it owns";
  for (const auto& [k, want] : {std::pair{k1, older(k1)}, std::pair{k2, newer(k2)}, std::pair{k3, older(k3)}})
    for (const auto& o : owners(three, k))
      EXPECT_TRUE(read_direct(o, k, kBytes) == want) << "chunk " << k << " on owner " << o;
}

// A new owner out of space (its tenant's quota) refuses part of a rebalance. The
// passes after it used to offer every object again (the ones already delivered came
// back "present"), once a second for as long as the quota lasted; now they back off
// and send only what is missing: after the quota is raised, the pass that finishes
// copies the refused objects alone.
TEST_F(EtcdMembership, ARetryPassSendsOnlyWhatTheOwnerRefused) {
  constexpr uint32_t kChunks = 48;
  constexpr size_t kBytes = 64 * 1024;  // 3 MiB in all; the new owner may keep 1 MiB
  EtcdCluster cl;
  ASSERT_TRUE(cl.etcd.started());
  const std::string a = cl.start_node();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(wait_settled(cl.etcd.config(), {a}, deadline_in(30000ms)).empty());
  auto client = cluster::connect(cl.client_config(), deadline_in(5000ms));
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  for (uint32_t c = 0; c < kChunks; ++c)
    ASSERT_TRUE((*client)->put(kCtx, c, 0, payload(c, kBytes), deadline_in(5000ms)).ok()) << c;
  // With two members and R = 2 the joining node owns every chunk.
  const fs::path quotas = cl.dir() / "quotas.json";
  std::ofstream(quotas) << fmt::format("{{\"{}\": 1}}", kNs);
  const std::string b = cl.start_node(0, {"--namespace-quotas", quotas.string()});
  ASSERT_FALSE(b.empty());
  // The first pass ends short: some objects refused for space.
  std::optional<cluster::MigrationReport> first;
  ASSERT_TRUE(kvstream::testing::eventually([&] {
    auto reports = cluster::migration_reports(cl.etcd.config(), deadline_in(2000ms));
    for (const auto& r : reports.ok() ? *reports : std::vector<cluster::MigrationReport>{})
      if (r.node == a && r.members.size() == 2 && !r.done && r.objects_failed > 0) first = r;
    return first.has_value();
  })) << "no pass was refused for space";
  EXPECT_GT(first->objects_copied, 0u);
  EXPECT_EQ(first->objects_copied + first->objects_failed, kChunks);
  const size_t held = holdings(b).size();
  EXPECT_LT(held, kChunks);
  // Room for all of it: the next pass copies the rest, and nothing it delivered before.
  std::ofstream(quotas, std::ios::trunc) << fmt::format("{{\"{}\": 100}}", kNs);
  ASSERT_EQ(::kill(cl.pid_of(b), SIGHUP), 0);
  const auto reports = wait_settled(cl.etcd.config(), {a, b}, deadline_in(90000ms));
  ASSERT_FALSE(reports.empty()) << "the rebalance did not finish after the quota was raised";
  for (const auto& r : reports) {
    if (r.node != a) continue;
    EXPECT_EQ(r.objects_failed, 0u);
    EXPECT_EQ(r.objects_present, 0u) << "a retry pass offered objects an earlier pass had delivered";
    EXPECT_EQ(r.objects_copied, kChunks - held);
  }
  EXPECT_EQ(holdings(b).size(), kChunks);
}

TEST(EtcdClient, RejectsBadConfigAndReportsADeadEndpoint) {
  if (!etcd_built()) GTEST_SKIP() << kNotBuilt;
  cluster::EtcdConfig cfg;
  EXPECT_EQ(cluster::EtcdClient::create(cfg).status().code(), StatusCode::invalid_argument);  // no endpoint
  cfg.endpoints = {"127.0.0.1:2379"};
  EXPECT_EQ(cluster::EtcdClient::create(cfg).status().code(), StatusCode::invalid_argument);  // not a URL
  cfg.endpoints = {"http://127.0.0.1:1"};
  cfg.lease_ttl = 1s;
  EXPECT_EQ(cluster::EtcdClient::create(cfg).status().code(), StatusCode::invalid_argument);  // below etcd's minimum
  cfg.lease_ttl = 5s;
  auto r = cluster::current_members(cfg, deadline_in(2000ms));
  EXPECT_EQ(r.status().code(), StatusCode::unavailable) << r.status().to_string();
  CancelToken cancel;
  cancel.cancel();
  EXPECT_EQ(cluster::current_members(cfg, deadline_in(2000ms), cancel).status().code(), StatusCode::cancelled);
  cluster::ClusterConfig cc;
  cc.etcd = cfg;
  cc.nodes = {"127.0.0.1:7471"};
  EXPECT_EQ(cluster::connect(cc, deadline_in(1000ms)).status().code(), StatusCode::invalid_argument);  // both
}

// One watch response with a node's key deleted and put back (its lease ran out and it
// registered again at once), or put again alone (it restarted within its lease),
// reports the set without it first; other changes keep coming as the end state alone.
TEST(MembershipWatch, ANodeThatRegisteredAgainInOneResponseIsSeenLeaving) {
  using Set = cluster::Registrations;
  const auto event = [](bool deleted, const std::string& k, const std::string& v, int64_t rev) {
    cluster::EtcdEvent e;
    e.deleted = deleted, e.kv.key = k, e.kv.value = v, e.kv.mod_revision = rev;
    return e;
  };
  const auto del = [&](const std::string& k) { return event(true, k, "", 0); };
  const auto put = [&](const std::string& k, int64_t rev) { return event(false, "n/" + k, k, rev); };
  const Set ab = {{"n/a", {"a", 1}}, {"n/b", {"b", 2}}};
  EXPECT_EQ(cluster::member_steps(ab, {}), std::vector<Set>{ab});
  EXPECT_EQ(cluster::member_steps(ab, {put("c", 3), del("n/a")}), (std::vector<Set>{{{"n/b", {"b", 2}}, {"n/c", {"c", 3}}}}))
      << "a join and a leave: the end state";
  const Set ab4 = {{"n/a", {"a", 1}}, {"n/b", {"b", 4}}};
  EXPECT_EQ(cluster::member_steps(ab, {del("n/b"), put("b", 4)}), (std::vector<Set>{{{"n/a", {"a", 1}}}, ab4}));
  EXPECT_EQ(cluster::member_steps(ab, {del("n/a"), del("n/b"), put("a", 5), put("b", 6)}),
            (std::vector<Set>{{}, {{"n/a", {"a", 5}}, {"n/b", {"b", 6}}}}))
      << "both out in one step";
  EXPECT_EQ(cluster::member_steps(ab, {put("c", 3), del("n/c")}), std::vector<Set>{ab})
      << "a node that came and went: never a member";
  EXPECT_EQ(cluster::member_steps(ab, {put("b", 4)}), (std::vector<Set>{{{"n/a", {"a", 1}}}, ab4}))
      << "a put again alone (a restart in place): a new registration";
  EXPECT_EQ(cluster::member_steps(ab, {put("b", 2)}), std::vector<Set>{ab}) << "the same registration again: no change";
  // The member set says when each registered; its newest registration is what the
  // rebalance reports carry.
  const cluster::MemberSet set = cluster::member_set(ab4);
  EXPECT_EQ(set.nodes, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(set.registered.at("b"), 4);
  EXPECT_EQ(set.newest(), 4);
  EXPECT_EQ(cluster::member_set({}).newest(), 0);
}

// A watch on an etcd member cut off from its cluster's majority (here the other two
// members stopped; a partition alike) ends instead of staying open and silent: the
// client asks etcd to require a leader, and the member cancels the watch once it has
// none. The follower (MembershipWatch) then reads the set again from the endpoints,
// where one that lost its leader answers "no leader" at once and the next is tried.
// Before, the watch stayed open until its caller gave up, while a majority elsewhere
// could change the member set unseen.
TEST(EtcdClient, AWatchOnAMemberWithoutALeaderEndsInsteadOfStayingSilent) {
  if (EtcdServer::program().empty()) GTEST_SKIP() << "etcd is not installed (Debian package etcd-server)";
  test_util::EtcdMembers etcd("kvs-etcd3", 3);
  ASSERT_TRUE(etcd.started());
  auto c = cluster::EtcdClient::create(etcd.config({2}));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  CancelToken stop;
  std::atomic<bool> ended{false};
  Status st;
  std::thread watcher([&] {
    st = c->watch_prefix("/kvs-test/nodes/", 1, stop, [](const std::vector<cluster::EtcdEvent>&, int64_t) {});
    ended = true;
  });
  etcd.kill(0);
  etcd.kill(1);
  for (auto until = deadline_in(20000ms); !ended && Clock::now() < until;) std::this_thread::sleep_for(20ms);
  const bool by_itself = ended;
  stop.cancel();  // the watch of a client that does not require a leader ends only here
  watcher.join();
  EXPECT_TRUE(by_itself) << "the watch on a member without a leader stayed open for 20 s";
  EXPECT_EQ(st.code(), StatusCode::unavailable) << st.to_string();
  // A call there is refused at once: no leader.
  auto r = c->range_prefix("/kvs-test/nodes/", deadline_in(5000ms), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::unavailable) << r.status().to_string();
}

// The gateway answers a stream's call (a lease keep-alive) with an error object
// under "error"; that shape, and others a gateway or proxy may send, are errors of the
// call, never an exception out of it (a node's renewal thread once ended the process
// on {"error": {...}} during an election). A loopback listener answers each call.
TEST(EtcdClient, ErrorAnswersOfAnyShapeAreErrorsNotExceptions) {
  const std::vector<std::string> bodies = {
      R"({"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader","http_status":"Service Unavailable"}})",
      R"({"error":"etcdserver: no leader","code":14,"message":"etcdserver: no leader"})",
      R"({"error":7,"code":"fourteen","message":["no"]})",
      R"([1,2,3])",
  };
  for (const auto& body : bodies) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET, addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK), addr.sin_port = 0;
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    ASSERT_EQ(::listen(fd, 4), 0);
    std::thread server([fd, body] {
      const int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) return;
      char buf[4096];
      (void)::recv(c, buf, sizeof buf, 0);  // the request (small, one segment on loopback)
      const std::string reply = fmt::format(
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
          "Connection: close\r\n\r\n{}",
          body.size(), body);
      (void)::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
      ::close(c);
    });
    cluster::EtcdConfig cfg;
    cfg.endpoints = {fmt::format("http://127.0.0.1:{}", ntohs(addr.sin_port))};
    auto etcd = cluster::EtcdClient::create(cfg);
    ASSERT_TRUE(etcd.ok());
    auto ttl = etcd->keep_alive(1, deadline_in(5000ms), {});
    server.join();
    ::close(fd);
    ASSERT_FALSE(ttl.ok()) << body;
    EXPECT_EQ(ttl.status().code(), StatusCode::unavailable) << body << ": " << ttl.status().to_string();
  }
}

TEST(EtcdClient, PrefixEndIncrementsTheLastByte) {
  EXPECT_EQ(cluster::etcd_prefix_end("/a/"), "/a0");
  EXPECT_EQ(cluster::etcd_prefix_end(std::string("a\xff", 2)), "b");
}

}  // namespace

}  // namespace kvstream::test_etcd_membership

// Several storage nodes: the hash ring's placement and its stability, membership
// parsing, and the replicated client over three in-process nodes (replication 2) with
// a node killed mid-read and a node stalled.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "kvstream/cluster.hpp"
#include "kvstream/storage.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::test_cluster {

using namespace kvstream::storage;
using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string kSecret = "0123456789abcdef-cluster";

// ---- Placement -----------------------------------------------------------------

std::vector<std::string> node_names(int n, int first = 0) {
  std::vector<std::string> v;
  for (int i = first; i < first + n; ++i) v.push_back(fmt::format("10.0.{}.{}:7471", i / 200, i % 200 + 1));
  return v;
}

TEST(Ring, ReplicasAreDistinctAndIndependentOfInsertionOrder) {
  cluster::HashRing a, b;
  auto names = node_names(7);
  for (const auto& n : names) ASSERT_TRUE(a.add(n).ok());
  for (auto it = names.rbegin(); it != names.rend(); ++it) ASSERT_TRUE(b.add(*it).ok());
  EXPECT_EQ(a.add(names[0]).code(), StatusCode::already_exists);
  for (int k = 0; k < 2000; ++k) {
    const auto key = cluster::HashRing::chunk_key("ctx", k);
    const auto ra = a.replicas(key, 3);
    ASSERT_EQ(ra.size(), 3u);
    EXPECT_EQ(std::set<std::string>(ra.begin(), ra.end()).size(), 3u);
    EXPECT_EQ(ra, b.replicas(key, 3));
  }
  EXPECT_EQ(a.replicas("k", 99).size(), 7u);  // capped at the node count
  EXPECT_TRUE(cluster::HashRing().replicas("k", 2).empty());
}

TEST(Ring, AddingANodeMovesOnlyItsShare) {
  const uint32_t r = 2;
  const int keys = 20000;
  cluster::HashRing ring;
  for (const auto& n : node_names(10)) ASSERT_TRUE(ring.add(n).ok());
  std::vector<std::vector<std::string>> before;
  for (int k = 0; k < keys; ++k) before.push_back(ring.replicas(cluster::HashRing::chunk_key("c", k), r));
  const std::string added = node_names(1, 10)[0];
  ASSERT_TRUE(ring.add(added).ok());
  size_t primaries_moved = 0, placements_moved = 0;
  for (int k = 0; k < keys; ++k) {
    const auto after = ring.replicas(cluster::HashRing::chunk_key("c", k), r);
    if (after[0] != before[k][0]) {
      ++primaries_moved;
      EXPECT_EQ(after[0], added) << "a primary moved between old nodes";
    }
    for (const auto& n : after)
      if (std::find(before[k].begin(), before[k].end(), n) == before[k].end()) {
        ++placements_moved;
        EXPECT_EQ(n, added) << "a replica moved between old nodes";
      }
  }
  const double p = double(primaries_moved) / keys, q = double(placements_moved) / (keys * r);
  // The new node's share is 1/11 = 0.091.
  EXPECT_GT(p, 0.07);
  EXPECT_LT(p, 0.115);
  EXPECT_GT(q, 0.07);
  EXPECT_LT(q, 0.115);
  RecordProperty("primaries_moved", std::to_string(p));
  RecordProperty("placements_moved", std::to_string(q));
  // Removing it again restores every placement.
  ASSERT_TRUE(ring.remove(added).ok());
  for (int k = 0; k < keys; ++k) ASSERT_EQ(ring.replicas(cluster::HashRing::chunk_key("c", k), r), before[k]);
  EXPECT_EQ(ring.remove(added).code(), StatusCode::not_found);
}

// ---- Membership -----------------------------------------------------------------

TEST(Membership, ParsesCommentsAndBlankLines) {
  auto m = cluster::parse_membership("# storage nodes\n\n  10.0.0.1:7471  \nnode-b.example:7000 # rack 2\n[::1]:7471\r\n");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(*m, (std::vector<std::string>{"10.0.0.1:7471", "node-b.example:7000", "[::1]:7471"}));
}

TEST(Membership, BadLinesAreRejectedWithTheirLineNumber) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"a:1\nnode-without-port\n", "line 2: 'node-without-port': not host:port"},
      {"a:0\n", "line 1: 'a:0': port 0 is outside 1..65535"},
      {"a:1\n# x\na:70000\n", "line 3: 'a:70000': port 70000 is outside 1..65535"},
      {"a:1\nb:x1\n", "line 2: 'b:x1': port 'x1' is not a number"},
      {"a b:1\n", "line 1: 'a b:1': one host:port per line, no blanks inside"},
      {"a:1\n a:1\n", "line 2: 'a:1' is listed twice"},
      {"a/b:1\n", "line 1: 'a/b:1': host 'a/b' has a character '/' that no host name has"},
      {"# nothing\n\n", "lists no storage node"},
  };
  for (const auto& [text, want] : bad) {
    auto m = cluster::parse_membership(text, "nodes.txt");
    ASSERT_FALSE(m.ok()) << text;
    EXPECT_EQ(m.status().code(), StatusCode::invalid_argument);
    EXPECT_NE(m.status().message().find(want), std::string::npos) << m.status().message();
    EXPECT_EQ(m.status().message().rfind("nodes.txt", 0), 0u) << m.status().message();
  }
}

TEST(Membership, LoadsAFile) {
  const fs::path f = fs::temp_directory_path() / fmt::format("kvstream-members-{}.txt", ::getpid());
  std::ofstream(f) << "# two nodes\n127.0.0.1:7471\n127.0.0.1:7472\n";
  auto m = cluster::load_membership(f.string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->size(), 2u);
  fs::remove(f);
  EXPECT_EQ(cluster::load_membership(f.string()).status().code(), StatusCode::not_found);
  cluster::ClusterConfig cfg;
  cfg.nodes = {"127.0.0.1:1", "not an address"};
  cfg.name_space = "tenant-a";
  EXPECT_EQ(cluster::connect(cfg, deadline_in(1s)).status().code(), StatusCode::invalid_argument);
}

// ---- The replicated client over live nodes -------------------------------------------

using StallProxy = test_util::TcpProxy;

class Cluster : public ::testing::Test {
 protected:
  void SetUp() override {
    if (available_backends().empty() ||
        std::find(available_backends().begin(), available_backends().end(), "tcp") == available_backends().end())
      GTEST_SKIP() << "the tcp backend is not built in";
    start_nodes(0);
  }
  /// Three nodes in fresh directories, each namespace bound to `quota` bytes (0: none).
  void start_nodes(uint64_t quota) {
    servers_.clear();
    for (int i = 0; i < 3; ++i) {
      ServerConfig cfg;
      cfg.address = "127.0.0.1:0";
      cfg.directory = (root_ / fmt::format("node{}-{}", i, ++started_)).string();
      cfg.secrets = {{"tenant-a", kSecret}};
      cfg.default_namespace_quota_bytes = quota;
      auto s = Server::start(cfg);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      servers_.push_back(std::move(s).value());
    }
  }
  void TearDown() override {
    proxies_.clear();
    servers_.clear();
  }

  cluster::ClusterConfig config(const std::vector<std::string>& addresses) {
    cluster::ClusterConfig cfg;
    cfg.nodes = addresses;
    cfg.replication = 2;
    cfg.name_space = "tenant-a";
    cfg.secret = kSecret;
    cfg.retry_down_after = 10s;  // a node that failed stays avoided for the whole test
    return cfg;
  }
  std::vector<std::string> addresses() {
    std::vector<std::string> v;
    for (auto& s : servers_) v.push_back(s->address());
    return v;
  }

  // Puts `chunks` chunks of 2 levels; returns what was stored.
  std::map<std::pair<uint32_t, uint32_t>, std::vector<std::byte>> put_all(Client& c, const std::string& ctx,
                                                                          uint32_t chunks) {
    std::map<std::pair<uint32_t, uint32_t>, std::vector<std::byte>> stored;
    for (uint32_t chunk = 0; chunk < chunks; ++chunk)
      for (uint32_t level = 0; level < 2; ++level) {
        auto b = test_util::pattern(20000 + chunk * 977 + level * 30011, chunk * 7 + level);
        Status s = c.put(ctx, chunk, level, b, deadline_in(10s));
        EXPECT_TRUE(s.ok()) << s.to_string();
        stored[{chunk, level}] = std::move(b);
      }
    return stored;
  }

  kvstream::testing::TempDir root_{"kvstream-cluster"};
  int started_ = 0;
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<std::unique_ptr<StallProxy>> proxies_;
};

// One backend serves every node's connection: the replicated client reports its
// capabilities and passes the memory type of a registration to it (tcp refuses cuda).
TEST_F(Cluster, ReportsItsBackendsCapabilities) {
  auto c = cluster::connect(config(addresses()), deadline_in(10s));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const transport::Capabilities* caps = (*c)->capabilities();
  ASSERT_NE(caps, nullptr);
  EXPECT_EQ(caps->backend, "tcp");
  EXPECT_FALSE(caps->cuda_memory);
  std::vector<std::byte> buf(256);
  EXPECT_TRUE((*c)->register_memory(buf.data(), buf.size(), transport::MemoryType::host).ok());
  EXPECT_FALSE((*c)->register_memory(buf.data(), buf.size(), transport::MemoryType::cuda).ok());
}

TEST_F(Cluster, EveryChunkOnItsReplicasAndStatMerges) {
  auto c = cluster::connect(config(addresses()), deadline_in(10s));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const auto stored = put_all(**c, "ctx-r", 40);
  // Each node holds about 2/3 of the chunks; together 2 copies of each.
  uint64_t total = 0;
  for (auto& s : servers_) {
    EXPECT_GT(s->counters().bytes_in, 0u);
    total += s->counters().requests;
  }
  EXPECT_GE(total, 2u * 80u);
  auto st = (*c)->stat("ctx-r", deadline_in(5s));
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  ASSERT_EQ(st->size(), 40u);
  for (const ChunkStat& s : *st)
    for (uint32_t l = 0; l < 2; ++l) EXPECT_EQ(s.level_bytes[l], (stored.at({s.chunk, l}).size()));
  EXPECT_EQ(*(*c)->list(deadline_in(5s)), std::vector<std::string>{"ctx-r"});
  std::vector<std::byte> buf(1 << 20);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  ASSERT_TRUE(mr.ok());
  EXPECT_EQ((*c)->get("ctx-r", 99, 0, *mr, 0, buf.size(), deadline_in(5s)).status().code(), StatusCode::not_found);
  EXPECT_EQ((*c)->get("ctx-r", 0, 0, *mr, 0, 10, deadline_in(5s)).status().code(), StatusCode::out_of_range);
  CancelToken cancel;
  cancel.cancel();
  EXPECT_EQ((*c)->get("ctx-r", 0, 0, *mr, 0, buf.size(), deadline_in(5s), cancel).status().code(),
            StatusCode::cancelled);
  EXPECT_EQ((*c)->get("ctx-r", 0, 0, *mr, 0, buf.size(), Clock::now() - 1ms).status().code(), StatusCode::timed_out);
  ASSERT_TRUE((*c)->remove("ctx-r", deadline_in(5s)).ok());
  EXPECT_EQ((*c)->stat("ctx-r", deadline_in(5s)).status().code(), StatusCode::not_found);
  EXPECT_EQ((*c)->remove("ctx-r", deadline_in(5s)).code(), StatusCode::not_found);
}

// Two writers of one object through the replicated client, at the same moment, many
// rounds: the writes reach the two replicas in either order, and each replica keeps
// the newest version, so both replicas hold the same bytes after every round; the
// writer that lost is told so (already_exists), never a silent ok.
TEST_F(Cluster, ConcurrentWritersLeaveReplicasAgreeing) {
  auto a = cluster::connect(config(addresses()), deadline_in(10s));
  auto b = cluster::connect(config(addresses()), deadline_in(10s));
  ASSERT_TRUE(a.ok() && b.ok());
  const auto va = test_util::pattern(300000, 1), vb = test_util::pattern(200000, 2);
  std::vector<std::unique_ptr<Client>> direct;
  for (const auto& addr : addresses()) {
    ClientConfig cc;
    cc.address = addr, cc.name_space = "tenant-a", cc.secret = kSecret;
    auto c = Client::connect(cc, deadline_in(10s));
    ASSERT_TRUE(c.ok());
    direct.push_back(std::move(c).value());
  }
  std::vector<std::byte> buf(1 << 20);
  int lost = 0;
  for (int round = 0; round < 20; ++round) {
    Status sa, sb;
    std::thread ta([&] { sa = (*a)->put("both", 0, 0, va, deadline_in(10s)); });
    std::thread tb([&] { sb = (*b)->put("both", 0, 0, vb, deadline_in(10s)); });
    ta.join(), tb.join();
    for (const Status& s : {sa, sb}) {
      EXPECT_TRUE(s.ok() || s.code() == StatusCode::already_exists) << s.to_string();
      lost += s.code() == StatusCode::already_exists;
    }
    ASSERT_TRUE(sa.ok() || sb.ok()) << "one of the two writes wins";
    std::vector<std::vector<std::byte>> held;
    for (auto& d : direct) {
      auto mr = d->register_memory(buf.data(), buf.size());
      auto n = d->get("both", 0, 0, *mr, 0, buf.size(), deadline_in(10s));
      if (n.status().code() == StatusCode::not_found) continue;  // not one of its replicas
      ASSERT_TRUE(n.ok()) << n.status().to_string();
      held.emplace_back(buf.begin(), buf.begin() + long(*n));
    }
    ASSERT_EQ(held.size(), 2u);
    ASSERT_EQ(held[0], held[1]) << "round " << round << ": the replicas disagree";
    ASSERT_TRUE(held[0] == va || held[0] == vb);
  }
  RecordProperty("writes_lost_to_a_newer_one", lost);
}

TEST_F(Cluster, NodeKilledMidReadEveryChunkStillReadsBack) {
  const auto addrs = addresses();
  auto c = cluster::connect(config(addrs), deadline_in(10s));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const uint32_t chunks = 60;
  const auto stored = put_all(**c, "ctx-k", chunks);
  const size_t slot = 128 * 1024;
  std::vector<std::byte> buf(slot * chunks * 2);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  ASSERT_TRUE(mr.ok());
  // Each read succeeds within its deadline (a read that ran out would fail): the
  // deadline bounds the test, what is checked is that every read came back whole.
  const auto deadline_each = 20s;
  // The first third one by one, the rest all in flight while node 1 dies.
  std::vector<std::future<Result<size_t>>> fs;
  size_t i = 0;
  for (auto& [key, bytes] : stored) {
    if (i < stored.size() / 3) {
      auto r = (*c)->get("ctx-k", key.first, key.second, *mr, i * slot, slot, deadline_in(deadline_each));
      ASSERT_TRUE(r.ok()) << r.status().to_string();
    } else {
      if (i == stored.size() / 3) servers_[1].reset();  // killed with requests about to go out
      fs.push_back((*c)->get_future("ctx-k", key.first, key.second, *mr, i * slot, slot, deadline_in(deadline_each)));
    }
    ++i;
  }
  for (auto& f : fs) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
  }
  i = 0;
  for (auto& [key, bytes] : stored) {
    ASSERT_EQ(std::memcmp(buf.data() + i * slot, bytes.data(), bytes.size()), 0) << key.first << "/" << key.second;
    ++i;
  }
  // stat and list still answer (one node down is within replication 2)...
  auto st = (*c)->stat("ctx-k", deadline_in(3s));
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->size(), chunks);
  // ...but a put to a chunk that has the dead node as a replica cannot reach both,
  // and only such a put fails. (Which chunks those are follows from the nodes' ports:
  // taken from the ring, five of each.)
  cluster::HashRing ring;
  for (const auto& a : addrs) ASSERT_TRUE(ring.add(a).ok());
  std::set<uint32_t> with_dead, without_dead, refused;
  for (uint32_t k = 0; (with_dead.size() < 5 || without_dead.size() < 5) && k < 100000; ++k) {
    const auto r = ring.replicas(cluster::HashRing::chunk_key("ctx-k2", k), 2);
    auto& side = std::find(r.begin(), r.end(), addrs[1]) != r.end() ? with_dead : without_dead;
    if (side.size() < 5) side.insert(k);
  }
  ASSERT_EQ(with_dead.size() + without_dead.size(), 10u);
  for (const auto& side : {with_dead, without_dead})
    for (uint32_t k : side)
      if (!(*c)->put("ctx-k2", k, 0, test_util::pattern(100, k), deadline_in(10s)).ok()) refused.insert(k);
  EXPECT_EQ(refused, with_dead);
}

// Node 0 stalls (its proxy stops forwarding). Every read still succeeds, and only one
// of them was sent to node 0: the first that ranked it first waited out its share of
// the deadline there and failed over; the node was avoided after that. What node 0
// was sent is counted by the node itself once the proxy forwards again.
TEST_F(Cluster, StalledNodeIsFailedOverWithinTheDeadline) {
  std::vector<std::string> via;
  for (auto& s : servers_) {
    proxies_.push_back(std::make_unique<StallProxy>(s->address()));
    via.push_back(proxies_.back()->address());
  }
  const uint32_t chunks = 30;
  std::map<std::pair<uint32_t, uint32_t>, std::vector<std::byte>> stored;
  {
    auto writer = cluster::connect(config(via), deadline_in(10s));
    ASSERT_TRUE(writer.ok()) << writer.status().to_string();
    stored = put_all(**writer, "ctx-s", chunks);
  }
  // A fresh reader has measured no node, so it starts with each chunk's primary:
  // node 0 for about a third of them. Then node 0 stalls. It stays marked down for
  // the whole test, however slow the machine.
  auto cfg = config(via);
  cfg.retry_down_after = std::chrono::hours(1);
  auto c = cluster::connect(cfg, deadline_in(10s));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::vector<std::byte> buf(256 * 1024);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  ASSERT_TRUE(mr.ok());
  const uint64_t before = servers_[0]->counters().requests;
  proxies_[0]->pause(true);
  const auto deadline = 6s;  // the stalled attempt gets half; the failover the rest
  for (auto& [key, bytes] : stored) {
    auto r = (*c)->get("ctx-s", key.first, key.second, *mr, 0, buf.size(), deadline_in(deadline));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(*r, bytes.size());
    ASSERT_EQ(std::memcmp(buf.data(), bytes.data(), bytes.size()), 0);
  }
  // stat leaves out the node marked down and answers from the others.
  auto st = (*c)->stat("ctx-s", deadline_in(deadline));
  EXPECT_TRUE(st.ok()) << st.status().to_string();
  proxies_[0]->pause(false);
  // remove asks every node, node 0 too, on the same connection as the reads: once it
  // has answered, node 0 has counted everything sent to it before.
  EXPECT_EQ((*c)->remove("ctx-none", deadline_in(30s)).code(), StatusCode::not_found);
  EXPECT_EQ(servers_[0]->counters().requests - before, 2u) << "one stalled read and the remove";
}

// Parts go to every replica with the bytes and come back from the merged stat; range
// reads return the slices, and keep doing so from the other replica once a node dies;
// a put without parts clears them on every replica, and only a put whose replicas are
// both alive succeeds.
TEST_F(Cluster, PartsAndRangesWithFailover) {
  auto c = cluster::connect(config(addresses()), deadline_in(10s));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // Where a chunk lives follows from the nodes' ports, which the kernel picks: chunks
  // 0..11 all had node 1 as a replica in about 1 run in 125, and then no put could
  // succeed once it died. The chunks are picked from the ring instead, four on each
  // pair of nodes: node 1's death leaves four whole and eight with one replica.
  const uint32_t chunks = 12;
  cluster::HashRing ring;
  for (const auto& a : addresses()) ASSERT_TRUE(ring.add(a).ok());
  const std::string dead = servers_[1]->address();
  std::map<std::set<std::string>, int> on_pair;
  std::vector<uint32_t> ids;
  std::set<uint32_t> both_alive;
  for (uint32_t k = 0; ids.size() < chunks && k < 100000; ++k) {
    const auto r = ring.replicas(cluster::HashRing::chunk_key("ctx-p", k), 2);
    if (on_pair[{r.begin(), r.end()}]++ >= 4) continue;
    ids.push_back(k);
    if (std::find(r.begin(), r.end(), dead) == r.end()) both_alive.insert(k);
  }
  ASSERT_EQ(ids.size(), chunks);
  ASSERT_EQ(both_alive.size(), 4u);
  std::map<uint32_t, std::vector<std::byte>> stored;
  std::map<uint32_t, std::vector<ObjectPart>> tables;
  for (uint32_t k : ids) {
    auto b = test_util::pattern(200000 + k * 1013, 50 + k);
    tables[k] = {{b.size() / 4, 4.0 + k}, {b.size() / 2, 2.0}, {b.size(), 1.0}};
    ASSERT_TRUE((*c)->put_parts("ctx-p", k, 1, b, tables[k], 0, deadline_in(10s)).ok());
    stored[k] = std::move(b);
  }
  const uint32_t first = ids[0];
  EXPECT_EQ((*c)->put_parts("ctx-p", first, 0, stored[first], std::vector<ObjectPart>{{1, 0}}, 0, deadline_in(10s)).code(),
            StatusCode::invalid_argument);
  auto st = (*c)->stat("ctx-p", deadline_in(5s));
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  ASSERT_EQ(st->size(), chunks);
  for (const ChunkStat& s : *st) {
    EXPECT_EQ(s.level_bytes, (std::vector<uint64_t>{0, stored.at(s.chunk).size()})) << s.chunk;
    EXPECT_EQ(s.level_parts, (std::vector<std::vector<ObjectPart>>{{}, tables.at(s.chunk)})) << s.chunk;
    // Each level's write version, the newest among the replicas (0: absent).
    ASSERT_EQ(s.level_versions.size(), 2u) << s.chunk;
    EXPECT_EQ(s.level_versions[0], 0u);
    EXPECT_GT(s.level_versions[1], 0u);
  }
  std::vector<std::byte> buf(1 << 20);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  ASSERT_TRUE(mr.ok());
  auto check_ranges = [&] {
    for (auto& [k, b] : stored)
      for (const auto& [o, l] : std::vector<std::pair<uint64_t, uint64_t>>{
               {0, b.size() / 4}, {b.size() / 4, b.size() / 4}, {b.size() - 1, 1}}) {
        auto r = (*c)->get_range("ctx-p", k, 1, o, l, *mr, 10, deadline_in(5s));
        ASSERT_TRUE(r.ok()) << k << " " << o << "+" << l << ": " << r.status().to_string();
        ASSERT_EQ(*r, l);
        ASSERT_EQ(std::memcmp(buf.data() + 10, b.data() + o, l), 0) << k << " " << o << "+" << l;
      }
  };
  check_ranges();
  EXPECT_EQ((*c)->get_range("ctx-p", first, 1, stored[first].size(), 1, *mr, 0, deadline_in(5s)).status().code(),
            StatusCode::out_of_range);
  EXPECT_EQ((*c)->get_range("ctx-p", 100001, 1, 0, 1, *mr, 0, deadline_in(5s)).status().code(), StatusCode::not_found);
  EXPECT_EQ((*c)->get_range("ctx-p", first, 1, 0, 0, *mr, 0, deadline_in(5s)).status().code(),
            StatusCode::invalid_argument);
  servers_[1].reset();
  check_ranges();
  // Chunks whose replicas are both alive take a put without parts; their parts go.
  // The others cannot reach both replicas (write quorum: all).
  std::set<uint32_t> cleared;
  for (auto& [k, b] : stored)
    if ((*c)->put("ctx-p", k, 1, b, deadline_in(10s)).ok()) cleared.insert(k);
  EXPECT_EQ(cleared, both_alive);
  st = (*c)->stat("ctx-p", deadline_in(5s));
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  for (const ChunkStat& s : *st)
    if (cleared.count(s.chunk)) EXPECT_TRUE(s.level_parts.empty()) << s.chunk;
}

// A put that every replica refuses for want of space (here the namespace's quota) is
// no_space, not unavailable: retrying will not help. The nodes stay in use.
TEST_F(Cluster, APutNoReplicaHasSpaceForIsNoSpace) {
  start_nodes(60000);  // six 5000-byte chunks and their context on one node: 56 KiB (4 KiB units)
  auto c = cluster::connect(config(addresses()), deadline_in(10s));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const Status big = (*c)->put("ctx", 0, 0, test_util::pattern(70000, 1), deadline_in(10s));
  EXPECT_EQ(big.code(), StatusCode::no_space) << big.to_string();
  EXPECT_NE(big.message().find("quota"), std::string::npos) << big.message();
  for (uint32_t chunk = 0; chunk < 6; ++chunk)
    EXPECT_TRUE((*c)->put("ctx", chunk, 0, test_util::pattern(5000, uint8_t(chunk)), deadline_in(10s)).ok()) << chunk;
  uint64_t refusals = 0;
  for (auto& s : servers_) refusals += s->counters().quota_refusals;
  EXPECT_EQ(refusals, 2u) << "each of the big put's two replicas refused it once";
}

TEST_F(Cluster, StartsWithANodeDownAndAllDownIsUnavailable) {
  auto addrs = addresses();
  auto wrong = config(addrs);
  wrong.secret = "wrong-secret-of-16-bytes";
  EXPECT_EQ(cluster::connect(wrong, deadline_in(5s)).status().code(), StatusCode::permission_denied);
  servers_[2].reset();
  auto c = cluster::connect(config(addrs), deadline_in(10s));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  servers_.clear();
  auto none = cluster::connect(config(addrs), deadline_in(5s));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::unavailable);
}

}  // namespace

}  // namespace kvstream::test_cluster

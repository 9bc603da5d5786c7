// etcd membership (issue 21): storage nodes (kvstream-server processes) register in an
// etcd the test starts, the replicated client follows the member set, and after a join
// or a crash the nodes copy chunks to their new owners until every chunk has R
// replicas again. Placement is checked against the ring exactly; the moved share is
// reported; perf/etcd-rebalance.sh measures what a join leaves the nodes holding.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "kvstream/cluster.hpp"
#include "kvstream/membership.hpp"
#include "kvstream/storage.hpp"
#include "storage/cluster/etcd_client.hpp"
#include "tests/support/hang_guard.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/transport/etcd_server.hpp"

namespace kvstream::test_etcd_membership {

using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using test_util::EtcdServer;

namespace {

const std::string kNs = "tenant-a", kSecret = "0123456789abcdef-etcd", kCtx = "ctx-etcd";
constexpr uint32_t kReplication = 2;

std::vector<std::byte> payload(uint32_t chunk, size_t bytes) {
  std::vector<std::byte> v(bytes);
  uint64_t x = 0x9e3779b97f4a7c15ull * (chunk + 1);
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = std::byte(x);
  }
  return v;
}

// etcd, and kvstream-server processes registered in it.
class EtcdCluster {
 public:
  EtcdCluster() {
    std::ofstream(dir_ / "secrets.json") << fmt::format("{{\"{}\": \"{}\"}}", kNs, kSecret);
  }
  ~EtcdCluster() {
    nodes_.clear();  // SIGKILL each (what is left of them), then the directory goes
  }

  EtcdServer etcd{"kvs-etcd"};

  // Starts a node (its copy rate bound in MiB/s, 0: none; `extra` flags after the
  // others); its address, "" on failure.
  std::string start_node(uint64_t rate_mb = 0, const std::vector<std::string>& extra = {}) {
    return start_node_on((dir_ / fmt::format("n{}", nodes_.size())).string(), rate_mb, extra);
  }
  // The same on the store directory `store` (a node's that was stopped: it comes back
  // with what it held, under a new address).
  std::string start_node_on(const std::string& store, uint64_t rate_mb = 0, const std::vector<std::string>& extra = {}) {
    auto p = std::make_unique<kvstream::testing::NodeProcess>();
    std::vector<std::string> args = {"--listen", "127.0.0.1:0", "--dir", store, "--secrets",
                                     (dir_ / "secrets.json").string(), "--etcd", etcd.url(), "--etcd-prefix",
                                     "/kvs-test/", "--replication", std::to_string(kReplication), "--lease-ttl-s", "2",
                                     "--rebalance-mb-per-s", std::to_string(rate_mb)};
    args.insert(args.end(), extra.begin(), extra.end());
    if (!p->start(KVSTREAM_SERVER_BIN, args, "warn")) return {};
    const std::string a = p->address();
    nodes_.push_back(std::move(p));
    stores_[a] = store;
    return a;
  }
  std::string store_of(const std::string& address) const { return stores_.at(address); }
  // The pid of the node at `address` (0 if none).
  pid_t pid_of(const std::string& address) const {
    for (const auto& n : nodes_)
      if (n->address() == address) return n->pid();
    return 0;
  }
  const fs::path& dir() const { return dir_.path(); }
  void kill(const std::string& address) {
    for (auto& n : nodes_)
      if (n->address() == address) n->kill();
  }
  // Stops the node at `address` where it is (SIGSTOP: its lease runs out, its process
  // stays), and lets it go on (SIGCONT).
  void pause(const std::string& address) {
    if (const pid_t pid = pid_of(address)) ::kill(pid, SIGSTOP);
  }
  void resume(const std::string& address) {
    if (const pid_t pid = pid_of(address)) ::kill(pid, SIGCONT);
  }

  cluster::ClusterConfig client_config() const {
    cluster::ClusterConfig c;
    c.etcd = etcd.config();
    c.replication = kReplication;
    c.name_space = kNs;
    c.secret = kSecret;
    return c;
  }

 private:
  kvstream::testing::TempDir dir_{"kvs-etcd-nodes"};
  std::vector<std::unique_ptr<kvstream::testing::NodeProcess>> nodes_;
  std::map<std::string, std::string> stores_;  // address -> store directory
};

// Waits until the registered set is `members` and every one of them reports its
// rebalance for exactly that set done (and with `trimmed`, its surplus copies dealt
// with); the reports, or empty at the deadline.
std::vector<cluster::MigrationReport> wait_settled(const cluster::EtcdConfig& etcd, std::vector<std::string> members,
                                                   Deadline deadline, bool trimmed = false) {
  std::sort(members.begin(), members.end());
  while (Clock::now() < deadline) {
    auto now = cluster::current_members(etcd, deadline_in(2000ms));
    auto reports = cluster::migration_reports(etcd, deadline_in(2000ms));
    if (now.ok() && reports.ok() && *now == members && reports->size() == members.size() &&
        std::all_of(reports->begin(), reports->end(),
                    [&](const cluster::MigrationReport& r) {
                      return r.done && (r.trimmed || !trimmed) && r.members == members;
                    }))
      return std::move(reports).value();
    std::this_thread::sleep_for(100ms);
  }
  return {};
}

// Starts `n` nodes (their copy rate bound in MiB/s, 0: none) and waits until they
// report their rebalance for that set done (with `trimmed`, their surplus copies dealt
// with too); their addresses, or empty after a test failure.
std::vector<std::string> start_settled(EtcdCluster& cl, int n, uint64_t rate_mb = 0, bool trimmed = false,
                                       const std::vector<std::string>& extra = {}) {
  std::vector<std::string> nodes;
  for (int i = 0; i < n; ++i) {
    nodes.push_back(cl.start_node(rate_mb, extra));
    if (nodes.back().empty()) {
      ADD_FAILURE() << "node " << i << " did not start";
      return {};
    }
  }
  if (wait_settled(cl.etcd.config(), nodes, deadline_in(30000ms), trimmed).empty()) {
    ADD_FAILURE() << "the nodes did not settle";
    return {};
  }
  return nodes;
}

// A client of one node alone (as a client with a stale member set writes); null when
// it cannot connect (a test failure).
std::unique_ptr<storage::Client> direct(const std::string& address) {
  storage::ClientConfig cc;
  cc.address = address, cc.name_space = kNs, cc.secret = kSecret;
  auto c = storage::Client::connect(cc, deadline_in(5000ms));
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Level 0 of chunk k of kCtx as one node serves it; empty when it does not.
std::vector<std::byte> read_direct(const std::string& address, uint32_t k, size_t bytes) {
  std::vector<std::byte> buf(bytes);
  auto c = direct(address);
  if (!c) return {};
  auto region = c->register_memory(buf.data(), buf.size());
  if (!region.ok()) return {};
  auto r = c->get(kCtx, k, 0, *region, 0, buf.size(), deadline_in(5000ms));
  return r.ok() && *r == bytes ? buf : std::vector<std::byte>{};
}

// What one node serves of `ctx`: chunk -> bytes (level 0).
std::map<uint32_t, uint64_t> holdings_of(const std::string& address, const std::string& ctx) {
  auto c = direct(address);
  std::map<uint32_t, uint64_t> out;
  if (!c) return out;
  auto st = c->stat(ctx, deadline_in(5000ms));
  if (!st.ok()) return out;  // not_found: holds nothing
  for (const auto& s : *st)
    if (!s.level_bytes.empty() && s.level_bytes[0] > 0) out[s.chunk] = s.level_bytes[0];
  return out;
}
std::map<uint32_t, uint64_t> holdings(const std::string& address) { return holdings_of(address, kCtx); }

// Every chunk reads back whole and equal through `client`; the count that did.
int read_all(storage::Client& client, uint32_t chunks, size_t bytes, const std::string& ctx = kCtx) {
  std::vector<std::byte> buf(bytes);
  auto region = client.register_memory(buf.data(), buf.size());
  if (!region.ok()) return -1;
  int good = 0;
  for (uint32_t c = 0; c < chunks; ++c) {
    auto r = client.get(ctx, c, 0, *region, 0, buf.size(), deadline_in(5000ms));
    if (r.ok() && *r == bytes && buf == payload(c, bytes)) ++good;
  }
  return good;
}

std::vector<std::string> owners(const std::vector<std::string>& members, uint32_t chunk) {
  // One ring per member set, kept: a ring is 1024 points a node, and building one per
  // call cost about 15 ms under TSan, 45 s for the checks after a join, long enough for
  // the nodes' idle timeout to close the test client's connections. (Called from the
  // test's own thread only.)
  static std::map<std::vector<std::string>, cluster::HashRing> rings;
  auto it = rings.find(members);
  if (it == rings.end()) {
    cluster::HashRing ring;
    for (const auto& m : members) (void)ring.add(m);
    it = rings.emplace(members, std::move(ring)).first;
  }
  return it->second.replicas(cluster::HashRing::chunk_key(kCtx, chunk), kReplication);
}

// Whether kvstream was built with etcd membership (libcurl).
bool etcd_built() {
  cluster::EtcdConfig probe;
  probe.endpoints = {"http://127.0.0.1:1"};
  return cluster::EtcdClient::create(probe).status().code() != StatusCode::unsupported;
}
const char* const kNotBuilt = "kvstream was built without etcd membership (libcurl4-openssl-dev, KVSTREAM_WITH_ETCD)";

// Whether `client` puts a chunk that `node` owns among `members` on it. The client
// learns of a node through its watch; a put before then goes to the old owners, so
// the put is repeated (up to 5 s) until the node holds it.
bool places_on(storage::Client& client, const std::vector<std::string>& members, const std::string& node) {
  for (uint32_t k = 100; k < 140; ++k) {
    const auto o = owners(members, k);
    if (std::find(o.begin(), o.end(), node) == o.end()) continue;
    for (int attempt = 0; attempt < 100; ++attempt) {
      if (!client.put(kCtx, k, 0, payload(k, 4096), deadline_in(5000ms)).ok()) return false;
      if (holdings(node).count(k) > 0) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }
  return false;
}

class EtcdMembership : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!etcd_built()) GTEST_SKIP() << kNotBuilt;
    if (EtcdServer::program().empty()) GTEST_SKIP() << "etcd is not installed (Debian package etcd-server)";
  }
};

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

// kCtx and `kept` written (chunks 0 to `chunks` - 1) through `client`; then three[2]
// killed holding `held` (what it held of kCtx; with `paused`, stopped where it is), the
// other two settled without it, and kCtx removed through `client` (tried again while its
// watch may still name the node gone: every member must take a remove). Fatal failures
// end the calling test.
void remove_while_away(EtcdCluster& cl, storage::Client& client, const std::vector<std::string>& three,
                       const std::string& kept, uint32_t chunks, size_t bytes, std::map<uint32_t, uint64_t>& held,
                       bool paused = false) {
  for (uint32_t c = 0; c < chunks; ++c) {
    ASSERT_TRUE(client.put(kCtx, c, 0, payload(c, bytes), deadline_in(5000ms)).ok()) << c;
    ASSERT_TRUE(client.put(kept, c, 0, payload(c, bytes), deadline_in(5000ms)).ok()) << c;
  }
  held = holdings(three[2]);
  ASSERT_FALSE(held.empty());
  // A node that goes on has its cache too: read once, each chunk is in it.
  if (paused)
    for (const auto& [c, b] : held) ASSERT_FALSE(read_direct(three[2], c, bytes).empty()) << c;
  if (paused) cl.pause(three[2]);
  else cl.kill(three[2]);
  ASSERT_FALSE(wait_settled(cl.etcd.config(), {three[0], three[1]}, deadline_in(30000ms), /*trimmed=*/true).empty());
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

// A node is killed holding copies of a context; while it is away (out of the
// membership) a client removes the context from every member. The node comes back
// on its old disk: it serves nothing it held until the members have handed it the
// remove, so it drops its copies instead of serving them or handing them to their
// owners, and the context stays removed. Another context, not removed, is served by
// it again once they have.
TEST_F(EtcdMembership, ARemoveMadeWhileANodeWasAwayStaysMadeWhenItComesBack) {
  constexpr uint32_t kChunks = 48;
  constexpr size_t kBytes = 4 * 1024;
  EtcdCluster cl;
  ASSERT_TRUE(cl.etcd.started());
  const auto three = start_settled(cl, 3);
  ASSERT_EQ(three.size(), 3u);
  auto client = cluster::connect(cl.client_config(), deadline_in(5000ms));
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  const std::string kept = "ctx-kept";
  const std::string away = three[2];
  std::map<uint32_t, uint64_t> held_chunks;
  remove_while_away(cl, **client, three, kept, kChunks, kBytes, held_chunks);
  if (HasFatalFailure()) return;
  const size_t held = held_chunks.size();
  const std::vector<std::string> two = {three[0], three[1]};

  const std::string back = cl.start_node_on(cl.store_of(away));
  ASSERT_FALSE(back.empty());
  // At once, before the members' passes (after their settle): none of its old copies.
  for (const auto& [c, bytes] : held_chunks) EXPECT_TRUE(read_direct(back, c, kBytes).empty()) << "chunk " << c;
  uint64_t handed_on = 0;
  settled_with_kctx_removed(cl, **client, {two[0], two[1], back}, kChunks, kBytes, handed_on);
  if (HasFatalFailure()) return;
  EXPECT_GE(handed_on, 1u) << "no member handed the remove to the node that came back";
  // The context not removed: what the returning node holds of it is served again.
  auto d = direct(back);
  ASSERT_TRUE(d);
  auto kept_there = d->stat(kept, deadline_in(5000ms));
  ASSERT_TRUE(kept_there.ok()) << kept_there.status().to_string();
  EXPECT_FALSE(kept_there->empty());
  std::printf("return: %zu copies on the node that came back, %llu removes handed to it\n", held,
              static_cast<unsigned long long>(handed_on));
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
  EtcdCluster cl;
  ASSERT_TRUE(cl.etcd.started());
  const auto three = start_settled(cl, 3, 0, false, memory);
  ASSERT_EQ(three.size(), 3u);
  auto client = cluster::connect(cl.client_config(), deadline_in(5000ms));
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  const std::string kept = "ctx-kept";
  const std::string away = three[2];
  std::map<uint32_t, uint64_t> held_chunks;
  remove_while_away(cl, **client, three, kept, kChunks, kBytes, held_chunks);
  if (HasFatalFailure()) return;
  const std::vector<std::string> two = {three[0], three[1]};
  // Until the members have forgotten the remove (their memory, and a second).
  std::this_thread::sleep_for(5s);

  const std::string back = cl.start_node_on(cl.store_of(away), 0, memory);
  ASSERT_FALSE(back.empty());
  uint64_t handed_on = 0;
  settled_with_kctx_removed(cl, **client, {two[0], two[1], back}, kChunks, kBytes, handed_on);
  if (HasFatalFailure()) return;
  EXPECT_EQ(handed_on, 0u) << "the members still remembered the remove";
  EXPECT_EQ(read_all(**client, kChunks, kBytes, kept), int(kChunks)) << "the context not removed";
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
  EtcdCluster cl;
  ASSERT_TRUE(cl.etcd.started());
  const auto three = start_settled(cl, 3);
  ASSERT_EQ(three.size(), 3u);
  auto client = cluster::connect(cl.client_config(), deadline_in(5000ms));
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  const std::string kept = "ctx-kept";
  const std::string away = three[2];
  std::map<uint32_t, uint64_t> held_chunks;
  remove_while_away(cl, **client, three, kept, kChunks, kBytes, held_chunks, /*paused=*/true);
  if (HasFatalFailure()) return;
  cl.resume(away);
  ASSERT_TRUE(registered(cl.etcd.config(), away, deadline_in(20000ms))) << "the node did not register again";
  // At once, before the members' passes (after their settle): none of its old copies.
  int served = 0;
  for (const auto& [c, bytes] : held_chunks) served += !read_direct(away, c, kBytes).empty();
  EXPECT_EQ(served, 0) << "of " << held_chunks.size() << " chunks of the removed context it held";
  uint64_t handed_on = 0;
  settled_with_kctx_removed(cl, **client, three, kChunks, kBytes, handed_on);
  if (HasFatalFailure()) return;
  EXPECT_GE(handed_on, 1u) << "no member handed the remove to the node that came back";
  auto d = direct(away);
  ASSERT_TRUE(d);
  auto kept_there = d->stat(kept, deadline_in(5000ms));
  ASSERT_TRUE(kept_there.ok()) << kept_there.status().to_string();
  EXPECT_FALSE(kept_there->empty()) << "the context not removed is served by it again";
  EXPECT_EQ(read_all(**client, kChunks, kBytes, kept), int(kChunks));
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
  EtcdCluster cl;
  ASSERT_TRUE(cl.etcd.started());
  const auto three = start_settled(cl, 3, 0, false, memory);
  ASSERT_EQ(three.size(), 3u);
  auto client = cluster::connect(cl.client_config(), deadline_in(5000ms));
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  const std::string kept = "ctx-kept";
  const std::string away = three[2];
  std::map<uint32_t, uint64_t> held_chunks;
  remove_while_away(cl, **client, three, kept, kChunks, kBytes, held_chunks, /*paused=*/true);
  if (HasFatalFailure()) return;
  std::this_thread::sleep_for(5s);  // until the members have forgotten the remove
  cl.resume(away);
  uint64_t handed_on = 0;
  settled_with_kctx_removed(cl, **client, three, kChunks, kBytes, handed_on);
  if (HasFatalFailure()) return;
  EXPECT_EQ(handed_on, 0u) << "the members still remembered the remove";
  EXPECT_EQ(read_all(**client, kChunks, kBytes, kept), int(kChunks)) << "the context not removed";
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
  auto client = cluster::connect(cl.client_config(), deadline_in(5000ms));
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  const std::string kept = "ctx-kept";
  for (uint32_t c = 0; c < kChunks; ++c) {
    ASSERT_TRUE((*client)->put(kCtx, c, 0, payload(c, kBytes), deadline_in(5000ms)).ok());
    ASSERT_TRUE((*client)->put(kept, c, 0, payload(c, kBytes), deadline_in(5000ms)).ok());
  }
  const std::string away = three[2];
  ASSERT_FALSE(holdings(away).empty());
  cl.pause(away);
  for (const auto& n : {three[0], three[1]}) {
    auto d = direct(n);
    ASSERT_TRUE(d);
    ASSERT_TRUE(d->remove(kCtx, deadline_in(5000ms)).ok()) << n;
  }
  // Let it go on as soon as etcd has dropped it: it registers again at once.
  bool dropped = false;
  for (auto until = deadline_in(20000ms); !dropped && Clock::now() < until; std::this_thread::sleep_for(10ms)) {
    auto now = cluster::current_members(cl.etcd.config(), deadline_in(2000ms));
    dropped = now.ok() && std::find(now->begin(), now->end(), away) == now->end();
  }
  cl.resume(away);
  ASSERT_TRUE(dropped) << "etcd did not drop the stopped node";
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
  bool serving = false;
  for (auto until = deadline_in(20000ms); !serving && Clock::now() < until; std::this_thread::sleep_for(100ms))
    serving = !holdings_of(away, kept).empty();
  ASSERT_TRUE(serving) << "the node that bounced never served what it held again";
  uint64_t again = 0;
  settled_with_kctx_removed(cl, **client, three, kChunks, kBytes, again);
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

TEST(EtcdClient, PrefixEndIncrementsTheLastByte) {
  EXPECT_EQ(cluster::etcd_prefix_end("/a/"), "/a0");
  EXPECT_EQ(cluster::etcd_prefix_end(std::string("a\xff", 2)), "b");
}

}  // namespace

}  // namespace kvstream::test_etcd_membership

// The etcd cluster the membership tests run (test_etcd_membership.cpp,
// test_etcd_removes.cpp): an etcd the test starts, kvstream-server processes
// registered in it (R = 2, lease TTL 2 s), stopped by PID, and the looks at what each
// node holds and serves.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvstream/cluster.hpp"
#include "kvstream/membership.hpp"
#include "kvstream/storage.hpp"
#include "storage/cluster/etcd_client.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/transport/etcd_server.hpp"

namespace kvstream::test_etcd {

using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using test_util::EtcdServer;


inline const std::string kNs = "tenant-a", kSecret = "0123456789abcdef-etcd", kCtx = "ctx-etcd";
inline constexpr uint32_t kReplication = 2;

inline std::vector<std::byte> payload(uint32_t chunk, size_t bytes) {
  std::vector<std::byte> v(bytes);
  uint64_t x = 0x9e3779b97f4a7c15ull * (chunk + 1);
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = std::byte(x);
  }
  return v;
}

// The tenant's secrets file of the tests' nodes, written at `path`.
inline void write_secrets(const fs::path& path) {
  std::ofstream(path) << fmt::format("{{\"{}\": \"{}\"}}", kNs, kSecret);
}

// kvstream-server's flags for a node of the tests' clusters: on loopback, its store at
// `store`, the tenant's `secrets`, registered through `etcd_urls` under /kvs-test/
// (lease TTL 2 s), placing chunks on `replication` nodes.
inline std::vector<std::string> node_args(const std::string& store, const fs::path& secrets,
                                          const std::vector<std::string>& etcd_urls, uint32_t replication) {
  std::vector<std::string> args = {"--listen", "127.0.0.1:0", "--dir", store, "--secrets", secrets.string()};
  for (const auto& url : etcd_urls) args.insert(args.end(), {"--etcd", url});
  args.insert(args.end(), {"--etcd-prefix", "/kvs-test/", "--replication", std::to_string(replication),
                           "--lease-ttl-s", "2"});
  return args;
}

// etcd, and kvstream-server processes registered in it.
class EtcdCluster {
 public:
  EtcdCluster() { write_secrets(dir_ / "secrets.json"); }
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
    auto args = node_args(store, dir_ / "secrets.json", {etcd.url()}, kReplication);
    args.insert(args.end(), {"--rebalance-mb-per-s", std::to_string(rate_mb)});
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

// kvstream-server processes of a test that runs its own etcd (a three-member one, to
// freeze one member): each on a store of its own, registered through the etcd URLs it
// is given (the first is where its watch goes), stopped by PID with this object.
class NodeGroup {
 public:
  explicit NodeGroup(const std::string& name) : dir_(name) { write_secrets(dir_.path() / "secrets.json"); }
  // A node with `replication`; its address, "" on failure.
  std::string start(const std::vector<std::string>& etcd_urls, uint32_t replication) {
    auto p = std::make_unique<kvstream::testing::NodeProcess>();
    const auto args = node_args((dir_.path() / fmt::format("n{}", nodes_.size())).string(),
                                dir_.path() / "secrets.json", etcd_urls, replication);
    if (!p->start(KVSTREAM_SERVER_BIN, args, "warn")) return {};
    nodes_.push_back(std::move(p));
    return nodes_.back()->address();
  }

 private:
  kvstream::testing::TempDir dir_;
  std::vector<std::unique_ptr<kvstream::testing::NodeProcess>> nodes_;
};

// Waits until the registered set is `members` and every one of them reports its
// rebalance for exactly that set done (and with `trimmed`, its surplus copies dealt
// with); the reports, or empty at the deadline.
inline std::vector<cluster::MigrationReport> wait_settled(const cluster::EtcdConfig& etcd, std::vector<std::string> members,
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
inline std::vector<std::string> start_settled(EtcdCluster& cl, int n, uint64_t rate_mb = 0, bool trimmed = false,
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
inline std::unique_ptr<storage::Client> direct(const std::string& address) {
  storage::ClientConfig cc;
  cc.address = address, cc.name_space = kNs, cc.secret = kSecret;
  auto c = storage::Client::connect(cc, deadline_in(5000ms));
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Level 0 of chunk k of kCtx as one node serves it; empty when it does not.
inline std::vector<std::byte> read_direct(const std::string& address, uint32_t k, size_t bytes) {
  std::vector<std::byte> buf(bytes);
  auto c = direct(address);
  if (!c) return {};
  auto region = c->register_memory(buf.data(), buf.size());
  if (!region.ok()) return {};
  auto r = c->get(kCtx, k, 0, *region, 0, buf.size(), deadline_in(5000ms));
  return r.ok() && *r == bytes ? buf : std::vector<std::byte>{};
}

// What one node serves of `ctx`: chunk -> bytes (level 0).
inline std::map<uint32_t, uint64_t> holdings_of(const std::string& address, const std::string& ctx) {
  auto c = direct(address);
  std::map<uint32_t, uint64_t> out;
  if (!c) return out;
  auto st = c->stat(ctx, deadline_in(5000ms));
  if (!st.ok()) return out;  // not_found: holds nothing
  for (const auto& s : *st)
    if (!s.level_bytes.empty() && s.level_bytes[0] > 0) out[s.chunk] = s.level_bytes[0];
  return out;
}
inline std::map<uint32_t, uint64_t> holdings(const std::string& address) { return holdings_of(address, kCtx); }

// Every chunk reads back whole and equal through `client`; the count that did.
inline int read_all(storage::Client& client, uint32_t chunks, size_t bytes, const std::string& ctx = kCtx) {
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

inline std::vector<std::string> owners(const std::vector<std::string>& members, uint32_t chunk,
                                const std::string& ctx = kCtx) {
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
  return it->second.replicas(cluster::HashRing::chunk_key(ctx, chunk), kReplication);
}

// Whether kvstream was built with etcd membership (libcurl).
inline bool etcd_built() {
  cluster::EtcdConfig probe;
  probe.endpoints = {"http://127.0.0.1:1"};
  return cluster::EtcdClient::create(probe).status().code() != StatusCode::unsupported;
}
inline const char* const kNotBuilt = "kvstream was built without etcd membership (libcurl4-openssl-dev, KVSTREAM_WITH_ETCD)";

// Whether `client` puts a chunk that `node` owns among `members` on it. The client
// learns of a node through its watch; a put before then goes to the old owners, so
// the put is repeated (up to 5 s) until the node holds it.
inline bool places_on(storage::Client& client, const std::vector<std::string>& members, const std::string& node) {
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

}  // namespace kvstream::test_etcd

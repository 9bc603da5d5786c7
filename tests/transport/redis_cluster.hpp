// A Redis Cluster for tests: 3 primaries and 3 replicas (redis-server in cluster mode
// on free loopback ports, joined with `redis-cli --cluster create`), stopped by PID on
// destruction. Tests skip when redis-server or redis-cli is missing.
#pragma once

#include <fstream>
#include <memory>
#include <sstream>

#include "tests/transport/redis_server.hpp"

namespace kvstream::transport::test_util {

class RedisCluster {
 public:
  struct Node {
    std::string id;
    uint16_t port = 0;
    bool primary = false;  // a master that serves slots
    std::string primary_id;  // a replica's primary
    bool failed = false;
  };

  static std::string unavailable_reason() {
    if (auto r = RedisServer::unavailable_reason(); !r.empty()) return r;
    if (!std::filesystem::exists("/usr/bin/redis-cli")) return "redis-cli is not installed (Debian package redis-tools)";
    return {};
  }

  /// `node_timeout_ms`: how long a silent primary takes to be declared failed (and
  /// replaced by its replica). `tls`: the nodes also serve TLS (tls_address()), and
  /// talk TLS to each other (tls-cluster, tls-replication); the fixture manages them
  /// over their clear ports.
  explicit RedisCluster(const std::string& tag, uint32_t node_timeout_ms = 1000,
                        std::optional<RedisServerTls> tls = std::nullopt) {
    if (tls) tls->clear_port_too = true;
    tls_ = tls;
    for (int i = 0; i < 6; ++i) {
      servers_.push_back(std::make_unique<RedisServer>(
          tag,
          // Replicas sync at once (redis waits 5 s by default for more replicas to
          // share one diskless transfer).
          std::vector<std::string>{"--cluster-node-timeout", std::to_string(node_timeout_ms),
                                   "--repl-diskless-sync-delay", "0"},
          true, tls));
      if (!servers_.back()->started()) {
        fail("redis-server " + std::to_string(i) + " did not start");
        return;
      }
    }
    std::vector<std::string> args{"--cluster", "create"};
    for (auto& s : servers_) args.push_back(s->address());
    args.insert(args.end(), {"--cluster-replicas", "1", "--cluster-yes"});
    if (auto out = cli(args); out.find("[OK] All 16384 slots covered") == std::string::npos) {
      fail("redis-cli --cluster create: " + out);
      return;
    }
    if (!wait_until_ok(std::chrono::seconds(30))) {
      fail("the cluster did not reach cluster_state:ok");
      return;
    }
    if (!wait_until_roles_known(std::chrono::seconds(30))) {
      fail("the nodes did not all learn which nodes are replicas");
      return;
    }
    ok_ = true;
  }

  [[nodiscard]] bool started() const { return ok_; }
  [[nodiscard]] const std::string& why_not() const { return why_; }
  [[nodiscard]] RedisServer& server(size_t i) { return *servers_[i]; }
  [[nodiscard]] size_t size() const { return servers_.size(); }
  [[nodiscard]] std::string seed() const { return servers_[0]->address(); }
  /// Every node's TLS address (a TLS cluster).
  [[nodiscard]] std::vector<std::string> tls_addresses() const {
    std::vector<std::string> out;
    for (const auto& s : servers_) out.push_back(s->tls_address());
    return out;
  }

  /// A cluster storage client of namespace `ns`.
  Result<std::unique_ptr<storage::Client>> client(uint32_t connections = 4, uint32_t put_replicas = 1,
                                                  std::chrono::milliseconds replica_after = std::chrono::milliseconds(250),
                                                  const std::string& ns = "tenant-a") const {
    redis::RedisConfig cfg;
    cfg.cluster = true;
    cfg.address = seed();
    for (size_t i = 1; i < servers_.size(); ++i) cfg.seeds.push_back(servers_[i]->address());
    cfg.name_space = ns;
    cfg.connections = connections;
    cfg.put_replicas = put_replicas;
    cfg.replica_after = replica_after;
    return redis::connect(cfg, deadline_in(std::chrono::seconds(10)));
  }

  /// The cluster as the first live node sees it (CLUSTER NODES).
  std::vector<Node> nodes() const {
    for (const auto& s : servers_)
      if (s->started()) return nodes(s->port());
    return {};
  }
  /// The cluster as the node on `port` sees it.
  std::vector<Node> nodes(uint16_t port) const {
    std::vector<Node> out;
    std::istringstream in(cli({"-p", std::to_string(port), "cluster", "nodes"}));
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      std::string id, addr, flags, primary;
      if (!(f >> id >> addr >> flags >> primary)) continue;
      const size_t colon = addr.find(':'), at = addr.find('@');
      if (colon == std::string::npos || at == std::string::npos || at <= colon + 1) continue;  // not a node line
      Node n;
      n.id = id;
      n.port = uint16_t(std::atoi(addr.substr(colon + 1, at - colon - 1).c_str()));
      // After them: ping-sent, pong-recv, config-epoch, link-state, then the slots.
      std::string ping, pong, epoch, link, first_slot;
      f >> ping >> pong >> epoch >> link;
      n.primary = flags.find("master") != std::string::npos && static_cast<bool>(f >> first_slot);
      n.failed = flags.find("fail") != std::string::npos;
      n.primary_id = primary == "-" ? "" : primary;
      out.push_back(n);
    }
    return out;
  }
  /// Index (into server()) of a live primary that has a live replica, and of that replica.
  std::pair<size_t, size_t> primary_and_replica() const {
    const auto all = nodes();
    for (const auto& p : all)
      if (p.primary && !p.failed)
        for (const auto& r : all)
          if (!r.primary && !r.failed && r.primary_id == p.id) return {index_of(p.port), index_of(r.port)};
    return {size_t(-1), size_t(-1)};
  }
  std::string id_of(size_t i) const {
    for (const auto& n : nodes(servers_[i]->port()))
      if (n.port == servers_[i]->port()) return n.id;
    return {};
  }

  /// Moves `slots` slots from primary `from` to primary `to` with their keys
  /// (redis-cli --cluster reshard); returns redis-cli's output.
  /// A TLS cluster is resharded over TLS: its nodes MIGRATE keys to each other over
  /// TLS, to the ports redis-cli names, which must be the TLS ones.
  std::string reshard(size_t from, size_t to, uint32_t slots) const {
    std::vector<std::string> args;
    if (tls_) args = {"--tls", "--cacert", tls_->ca, "--cert", tls_->cert, "--key", tls_->key};
    args.insert(args.end(), {"--cluster", "reshard", tls_ ? servers_[0]->tls_address() : seed(), "--cluster-from",
                             id_of(from), "--cluster-to", id_of(to), "--cluster-slots", std::to_string(slots),
                             "--cluster-yes"});
    return cli(args);
  }

  /// Until every live node reports cluster_state:ok and every live replica is in sync.
  bool wait_until_ok(std::chrono::milliseconds limit) const {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      bool all = true;
      for (const auto& s : servers_)
        if (s->started() && cli({"-p", std::to_string(s->port()), "cluster", "info"}).find("cluster_state:ok") ==
                                std::string::npos)
          all = false;
      // And every replica has its primary's data (not still loading it).
      if (all)
        for (const auto& n : nodes())
          if (!n.primary && !n.failed &&
              cli({"-p", std::to_string(n.port), "info", "replication"}).find("master_link_status:up") ==
                  std::string::npos)
            all = false;
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  /// Until every node's CLUSTER NODES lists the three replicas as replicas. `redis-cli
  /// --cluster create` makes them replicas one node at a time and the others learn it
  /// by gossip: until then a node lists a replica as a master (with no slots), which
  /// holds its primary's keys.
  bool wait_until_roles_known(std::chrono::milliseconds limit) const {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      bool all = true;
      for (const auto& s : servers_) {
        size_t replicas = 0;
        for (const auto& n : nodes(s->port())) replicas += n.primary_id.empty() ? 0 : 1;
        if (replicas != servers_.size() / 2) all = false;
      }
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  /// Until every live node's CLUSTER SLOTS lists a replica beside each primary. Redis
  /// 7.0 leaves out a replica whose replication offset, as gossiped, is still 0: on a
  /// new cluster that lasts until data is written and the offsets have travelled.
  bool wait_until_replicas_listed(std::chrono::milliseconds limit) const {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      bool all = true;
      for (const auto& s : servers_) {
        if (!s->started()) continue;
        // Each range's entry: start, end, then one "ip port id" block per node.
        std::istringstream in(cli({"-p", std::to_string(s->port()), "cluster", "slots"}));
        size_t ports = 0;
        for (std::string line; std::getline(in, line);)
          if (line.find("127.0.0.1") != std::string::npos) ++ports;
        if (ports < 6) all = false;
      }
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  /// Runs redis-cli with `args`; its stdout and stderr.
  static std::string cli(const std::vector<std::string>& args) {
    static int n = 0;
    const auto out = std::filesystem::temp_directory_path() / fmt::format("redis-cli-{}-{}.out", ::getpid(), n++);
    std::vector<std::string> all{"/usr/bin/redis-cli"};
    all.insert(all.end(), args.begin(), args.end());
    std::filesystem::remove(out);
    const pid_t pid = kvstream::testing::spawn_service(all, out);
    if (pid < 0) return "cannot run redis-cli";
    ::waitpid(pid, nullptr, 0);
    std::ifstream in(out);
    std::stringstream text;
    text << in.rdbuf();
    std::filesystem::remove(out);
    return text.str();
  }

 private:
  std::vector<std::unique_ptr<RedisServer>> servers_;
  std::optional<RedisServerTls> tls_;
  bool ok_ = false;
  std::string why_;

  void fail(std::string why) { why_ = std::move(why); }
  size_t index_of(uint16_t port) const {
    for (size_t i = 0; i < servers_.size(); ++i)
      if (servers_[i]->port() == port) return i;
    return size_t(-1);
  }
};

}  // namespace kvstream::transport::test_util

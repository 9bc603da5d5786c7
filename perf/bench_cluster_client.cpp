// kvstream-bench cluster-client: what a client of several storage nodes costs in this
// process (resident memory after connecting, time to connect, to register a buffer and
// to get from every node), with each node's client on a backend of its own (the
// anchor: what the replicated client did before it shared one, and what separate
// clients cost), on one shared backend, and through the replicated client. The nodes
// run outside this process (perf/cluster-client-cost.sh starts them), so the memory
// is the client's alone; run one mode per process, as that script does.
#include <fstream>
#include <string>

#include "kvstream/cluster.hpp"
#include "perf/bench.hpp"

namespace kvstream::bench {

namespace {

using transport::Clock;
using namespace std::chrono_literals;

// VmRSS of this process, MB.
double resident_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return -1;
}

double ms_since(Clock::time_point t0) { return since(t0) * 1e3; }

}  // namespace

int run_cluster_client_bench(const ClusterClientBenchOptions& o) {
  const Fail fail{"cluster-client"};
  if (o.nodes.empty()) return fail(make_status(StatusCode::invalid_argument, "no --node given"));
  const double rss0 = resident_mb();
  const auto deadline = transport::deadline_in(30s);
  std::vector<std::unique_ptr<storage::Client>> clients;  // one per node (own, shared), or the replicated one
  std::shared_ptr<transport::Backend> shared;
  transport::BackendConfig bc;
  bc.name = o.backend;
  auto t0 = Clock::now();
  if (o.mode == "cluster") {
    cluster::ClusterConfig cfg;
    cfg.nodes = o.nodes, cfg.backend = bc, cfg.name_space = o.name_space, cfg.secret = o.secret;
    cfg.replication = 1;
    auto c = cluster::connect(cfg, deadline);
    if (!c.ok()) return fail(c.status());
    clients.push_back(std::move(c).value());
  } else {
    if (o.mode == "shared") {
      auto b = transport::create_backend(bc);
      if (!b.ok()) return fail(b.status());
      shared = std::move(b).value();
    } else if (o.mode != "own") {
      return fail(make_status(StatusCode::invalid_argument, "--mode {}: own, shared or cluster", o.mode));
    }
    for (const auto& node : o.nodes) {
      storage::ClientConfig cc;
      cc.address = node, cc.backend = bc, cc.name_space = o.name_space, cc.secret = o.secret;
      auto c = shared ? storage::Client::connect(cc, shared, deadline) : storage::Client::connect(cc, deadline);
      if (!c.ok()) return fail(c.status());
      clients.push_back(std::move(c).value());
    }
  }
  const double connect_ms = ms_since(t0), rss_connected = resident_mb() - rss0;

  // One chunk of 1 MiB per node and client (the replicated client: 4 per node, spread
  // by the ring), put and then read back into one registered buffer.
  const size_t chunk = size_t(1) << 20, chunks = o.mode == "cluster" ? 4 * o.nodes.size() : o.nodes.size();
  std::vector<std::byte> buf(std::max(o.buffer_mb << 20, chunks * chunk));
  for (size_t i = 0; i < buf.size(); i += 4096) buf[i] = std::byte(i / 4096);
  t0 = Clock::now();
  // With a backend of its own each client registers the buffer; on a shared one a
  // registration serves every client (the replicated client registers once either way).
  std::vector<transport::MemoryRegion> regions;
  if (shared) {
    auto mr = shared->register_memory(buf.data(), buf.size(), transport::MemoryType::host);
    if (!mr.ok()) return fail(mr.status());
    regions.push_back(std::move(mr).value());
  } else {
    for (auto& c : clients) {
      auto mr = c->register_memory(buf.data(), buf.size());
      if (!mr.ok()) return fail(mr.status());
      regions.push_back(std::move(mr).value());
    }
  }
  const double register_ms = ms_since(t0);
  auto client_of = [&](size_t k) -> std::pair<storage::Client*, transport::MemoryRegion*> {
    return {clients[clients.size() == 1 ? 0 : k].get(), &regions[regions.size() == 1 ? 0 : k]};
  };
  for (size_t k = 0; k < chunks; ++k) {
    const Status s = client_of(k).first->put("cost", uint32_t(k), 0, std::span(buf.data(), chunk), deadline);
    if (!s.ok()) return fail(s);
  }
  double gets_ms[2] = {0, 0};  // the first round (a client's first use of a region), then again
  for (double& ms : gets_ms) {
    t0 = Clock::now();
    for (size_t k = 0; k < chunks; ++k) {
      auto [c, mr] = client_of(k);
      auto r = c->get("cost", uint32_t(k), 0, *mr, k * chunk, chunk, deadline);
      if (!r.ok()) return fail(r.status());
    }
    ms = ms_since(t0);
  }
  fmt::print("| {} | {} | {} | {:.1f} | {:.1f} | {:.2f} | {:.1f} | {:.1f} |\n", o.backend, o.nodes.size(), o.mode,
             connect_ms, rss_connected, register_ms, gets_ms[0], gets_ms[1]);
  return 0;
}

}  // namespace kvstream::bench

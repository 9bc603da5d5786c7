// Deterministic simulation of chunk placement on the consistent-hash ring
// (include/kvstream/cluster.hpp): load balance over N nodes with replication R, and
// the share of placements that move when a node is added or removed. Output is in
// docs/storage-backends.md. Usage: kvstream-cluster-sim [nodes] [replication] [chunks]
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "kvstream/cluster.hpp"

using kvstream::cluster::HashRing;

namespace {

std::string node(int i) { return fmt::format("10.1.{}.{}:7471", i / 250, i % 250 + 1); }

// Placements (key, replica) of every chunk: 1000 contexts of `chunks`/1000 chunks.
std::vector<std::vector<uint32_t>> place(const HashRing& ring, int chunks, uint32_t r) {
  std::vector<std::vector<uint32_t>> out;
  out.reserve(size_t(chunks));
  for (int i = 0; i < chunks; ++i)
    out.push_back(ring.replica_indexes(HashRing::chunk_key(fmt::format("ctx-{:04}", i % 1000), uint32_t(i / 1000)), r));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Placement simulation of the storage cluster's consistent-hash ring: load balance over the nodes "
               "and the placements that move when a node is added or removed"};
  int nodes = 100;
  uint32_t r = 2;
  int chunks = 200000;
  // Positional, as before. Node addresses are 10.1.<i/250>.<i%250+1>, so at most 64000 nodes
  // (one more is added in the simulation).
  app.add_option("nodes", nodes, "storage nodes")->check(CLI::Range(1, 63999))->capture_default_str();
  app.add_option("replication", r, "replicas of each chunk (at most the node count)")
      ->check(CLI::Range(1u, 1u << 16))
      ->capture_default_str();
  app.add_option("chunks", chunks, "chunks placed (1000 contexts of chunks/1000 chunks each)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (r > uint32_t(nodes))
    return app.exit(CLI::ValidationError("replication", fmt::format("{} is more than the {} nodes", r, nodes)));
  fmt::print("{} nodes, replication {}, {} chunks ({} placements)\n\n", nodes, r, chunks, uint64_t(chunks) * r);
  fmt::print("| points per node | max/mean placements | min/mean | moved adding node {} (ideal {:.4f}) | moved removing node 0 (ideal {:.4f}) | moved between other nodes |\n",
             nodes + 1, 1.0 / (nodes + 1), 1.0 / nodes);
  fmt::print("| --- | --- | --- | --- | --- | --- |\n");
  for (uint32_t vnodes : {16u, 64u, 128u, 256u, 512u}) {
    HashRing ring(vnodes);
    for (int i = 0; i < nodes; ++i) (void)ring.add(node(i));
    const auto base = place(ring, chunks, r);
    std::vector<uint64_t> load(size_t(nodes), 0);
    for (const auto& p : base)
      for (uint32_t n : p) ++load[n];
    const double mean = double(chunks) * r / nodes;
    const auto [mn, mx] = std::minmax_element(load.begin(), load.end());
    // Index-stable comparison by address: names() keeps insertion order, a removal shifts indexes.
    auto moved = [&](const HashRing& after_ring, const std::vector<std::vector<uint32_t>>& after,
                     const std::string& changed, uint64_t& between) {
      uint64_t m = 0;
      for (size_t k = 0; k < base.size(); ++k) {
        std::vector<std::string> a, b;
        for (uint32_t n : base[k]) a.push_back(ring.nodes()[n]);
        for (uint32_t n : after[k]) b.push_back(after_ring.nodes()[n]);
        for (const auto& x : b)
          if (std::find(a.begin(), a.end(), x) == a.end()) {
            ++m;
            // A placement that moved to a node other than the added one, or away from
            // a node other than the removed one, moved between unchanged nodes.
            if (x != changed && std::find(a.begin(), a.end(), changed) == a.end()) ++between;
          }
      }
      return double(m) / double(base.size() * r);
    };
    uint64_t between = 0;
    HashRing grown = ring;
    (void)grown.add(node(nodes));
    const double add = moved(grown, place(grown, chunks, r), node(nodes), between);
    HashRing shrunk = ring;
    (void)shrunk.remove(node(0));
    const double rem = moved(shrunk, place(shrunk, chunks, r), node(0), between);
    fmt::print("| {} | {:.3f} | {:.3f} | {:.4f} | {:.4f} | {} |\n", vnodes, double(*mx) / mean, double(*mn) / mean, add,
               rem, between);
  }
  return 0;
}

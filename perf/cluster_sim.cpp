// Deterministic simulation of chunk placement on the consistent-hash ring
// (include/kvstream/cluster.hpp): load balance over N nodes with replication R, the
// share of placements that move when a node is added or removed, the chunks left
// without a live replica when nodes fail together (before the rebalance restores R),
// and the share a fourth node takes when it joins three (over many address sets).
// Output is in docs/storage-backends.md.
// Usage: kvstream-cluster-sim [nodes] [replication] [chunks] [--availability] [--joins N]
#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
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

// Chunks with every replica among `down` nodes: unreadable until a node comes back
// (the rebalance after a failure restores R from the survivors, so only failures
// closer together than a rebalance pass count).
void print_availability(int nodes, int chunks) {
  fmt::print("\nChunks with no live replica, {} nodes, {} chunks, nodes down at once (20 random draws each):\n\n",
             nodes, chunks);
  fmt::print("| R | 1 down | 2 down | 3 down |\n| --- | --- | --- | --- |\n");
  HashRing ring;
  for (int i = 0; i < nodes; ++i) (void)ring.add(node(i));
  std::mt19937_64 rng(20261203);
  for (uint32_t r : {2u, 3u}) {
    const auto placed = place(ring, chunks, r);
    fmt::print("| {} |", r);
    for (int down = 1; down <= 3; ++down) {
      uint64_t lost = 0, worst = 0;
      for (int draw = 0; draw < 20; ++draw) {
        std::set<uint32_t> dead;
        while (int(dead.size()) < down) dead.insert(uint32_t(rng() % uint64_t(nodes)));
        uint64_t n = 0;
        for (const auto& p : placed)
          n += std::all_of(p.begin(), p.end(), [&](uint32_t x) { return dead.count(x) > 0; });
        lost += n, worst = std::max(worst, n);
      }
      fmt::print(" {:.5f}% (mean), worst {} of {} |", 100.0 * double(lost) / 20 / chunks, worst, chunks);
    }
    fmt::print("\n");
  }
}

// A 4th node joining 3 (R = 2): the share of stored placements it takes (all that
// move), over `sets` random address sets; the ideal is a quarter.
void print_joins(int sets, int chunks, uint32_t vnodes) {
  std::mt19937_64 rng(20261204);
  std::vector<double> shares;
  for (int s = 0; s < sets; ++s) {
    auto addr = [&] { return fmt::format("10.{}.{}.{}:{}", rng() % 250, rng() % 250, rng() % 250 + 1, 1024 + rng() % 60000); };
    HashRing three(vnodes);
    for (int i = 0; i < 3; ++i) (void)three.add(addr());
    HashRing four = three;
    const std::string added = addr();
    (void)four.add(added);
    uint64_t taken = 0;
    for (int i = 0; i < chunks; ++i)
      for (const auto& n : four.replicas(HashRing::chunk_key(fmt::format("ctx-{:04}", i % 1000), uint32_t(i / 1000)), 2))
        taken += n == added;
    shares.push_back(double(taken) / (2.0 * chunks));
  }
  std::sort(shares.begin(), shares.end());
  double sum = 0;
  int within = 0;
  for (double x : shares) sum += x, within += std::abs(x - 0.25) <= 0.025;
  fmt::print("\nA 4th node joining 3 (R = 2, {} chunks, {} points per node), {} random address sets: share of stored "
             "bytes it takes: mean {:.4f}, min {:.4f}, median {:.4f}, max {:.4f}; within 10% of a quarter in {} of {}\n",
             chunks, vnodes, sets, sum / sets, shares.front(), shares[shares.size() / 2], shares.back(), within, sets);
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
  bool availability = false;
  int joins = 0;
  app.add_flag("--availability", availability,
               "also: chunks with no live replica when 1, 2 or 3 random nodes are down at once, R = 2 and 3 "
               "(1024 points per node, the default, 20 draws each)");
  app.add_option("--joins", joins, "also: the share of stored bytes a 4th node takes joining 3, over this many "
                                   "random address sets (R = 2, 256 and 1024 points per node)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (r > uint32_t(nodes))
    return app.exit(CLI::ValidationError("replication", fmt::format("{} is more than the {} nodes", r, nodes)));
  fmt::print("{} nodes, replication {}, {} chunks ({} placements)\n\n", nodes, r, chunks, uint64_t(chunks) * r);
  fmt::print("| points per node | max/mean placements | min/mean | moved adding node {} (ideal {:.4f}) | moved removing node 0 (ideal {:.4f}) | moved between other nodes |\n",
             nodes + 1, 1.0 / (nodes + 1), 1.0 / nodes);
  fmt::print("| --- | --- | --- | --- | --- | --- |\n");
  for (uint32_t vnodes : {16u, 64u, 256u, 1024u}) {
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
  if (availability) print_availability(nodes, chunks);
  if (joins > 0)
    for (uint32_t vnodes : {256u, 1024u}) print_joins(joins, chunks, vnodes);
  return 0;
}

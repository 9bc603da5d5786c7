// What the replicated client knows of the cluster at one moment: its nodes, where
// chunks are placed now, and where they were placed before the last membership
// changes (a chunk stays readable from its old owners until the nodes' rebalance has
// copied it to the new ones). Views are immutable and swapped whole, so a call works
// on one consistent view however membership changes under it.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvstream/cluster.hpp"
#include "storage/cluster/node_health.hpp"

namespace kvstream::cluster {

/// One storage node as the client sees it. Nodes live as long as the client (a node
/// that leaves keeps its object, without a connection), so a pointer to one stays
/// valid in every view and every call in flight.
struct ClusterNode {
  std::string address;
  NodeHealth health;
  std::mutex mu;
  std::shared_ptr<storage::Client> client;       // null while not connected
  transport::Clock::time_point retry_at{};       // reconnect not before
  // Registrations of callers' regions with this node's backend, by the caller's
  // region (kept while the caller's region lives).
  std::map<const void*, std::pair<std::weak_ptr<transport::MemoryRegion::Impl>, transport::MemoryRegion>> regions;

  ClusterNode(std::string a, double weight) : address(std::move(a)), health(weight) {}
};

/// Where chunks go for one member set: the ring and its nodes (ring index -> node).
struct Placement {
  HashRing ring;
  std::vector<ClusterNode*> nodes;

  explicit Placement(uint32_t virtual_nodes) : ring(virtual_nodes) {}
  [[nodiscard]] std::vector<ClusterNode*> replicas(std::string_view key, uint32_t r) const {
    std::vector<ClusterNode*> out;
    for (uint32_t i : ring.replica_indexes(key, r)) out.push_back(nodes[i]);
    return out;
  }
  [[nodiscard]] bool has(const ClusterNode* n) const {
    return std::find(nodes.begin(), nodes.end(), n) != nodes.end();
  }
};

struct ClusterView {
  /// Placements kept from before the last membership changes.
  static constexpr size_t kPastPlacements = 3;
  std::shared_ptr<const Placement> now;
  std::vector<std::shared_ptr<const Placement>> past;  // newest first
  uint32_t replication = 1, write_quorum = 1;
};

}  // namespace kvstream::cluster

// What the replicated client knows of the cluster at one moment: its nodes, where
// chunks are placed now, and where they were placed before the last membership
// changes (a chunk stays readable from its old owners until the nodes' rebalance has
// copied it to the new ones). Views are immutable and swapped whole, so a call works
// on one consistent view however membership changes under it.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvstream/cluster.hpp"
#include "storage/cluster/node_health.hpp"

namespace kvstream::cluster {

/// Checks a ClusterConfig and settles its static members: `nodes` parsed, or read
/// from `membership_file` (left empty when etcd gives them). Errors: invalid_argument
/// (both etcd and a list, neither, a bad list, replication 0, a quorum above R, an
/// EWMA weight outside (0, 1], a bad namespace), and load_membership's.
Status check_cluster_config(ClusterConfig& cfg);

/// One storage node as the client sees it. Nodes live as long as the client (a node
/// that leaves keeps its object, without a connection), so a pointer to one stays
/// valid in every view and every call in flight.
struct ClusterNode {
  std::string address;
  NodeHealth health;
  std::mutex mu;
  std::shared_ptr<storage::Client> client;       // null while not connected
  transport::Clock::time_point retry_at{};       // reconnect not before

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
    return std::find(nodes.begin(), nodes.end(), n) != nodes.end();  // only after a change, for a missing chunk
  }
};

struct ClusterView {
  /// Placements kept from before the last membership changes.
  static constexpr size_t kPastPlacements = 3;
  std::shared_ptr<const Placement> now;
  std::vector<std::shared_ptr<const Placement>> past;  // newest first
  uint32_t replication = 1, write_quorum = 1;

  /// The view after `old` (null: the first) when chunks go by `now`: `old`'s
  /// placements become the past ones. R is capped at the node count; a write quorum
  /// of 0 means all R.
  static std::shared_ptr<const ClusterView> after(const ClusterView* old, std::shared_ptr<const Placement> now,
                                                  uint32_t replication, uint32_t write_quorum) {
    auto v = std::make_shared<ClusterView>();
    v->now = std::move(now);
    if (old) {
      v->past.push_back(old->now);
      for (const auto& p : old->past)
        if (v->past.size() < kPastPlacements) v->past.push_back(p);
    }
    v->replication = std::min<uint32_t>(replication, uint32_t(v->now->nodes.size()));
    v->write_quorum = write_quorum == 0 ? v->replication : std::min(write_quorum, v->replication);
    return v;
  }

  /// Owners of `key` under the past placements that are still members and not in
  /// `out` yet, appended to `out` (newest placement first): where a chunk not yet
  /// copied to its new owners still is.
  void append_past_owners(std::string_view key, std::vector<ClusterNode*>& out) const {
    for (const auto& p : past)
      for (ClusterNode* n : p->replicas(key, replication))
        if (now->has(n) && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
};

}  // namespace kvstream::cluster

// Several storage nodes behind one storage::Client: chunks are placed by consistent
// hashing (a ring of virtual nodes) on R distinct nodes each, written to every replica
// and read from the replica estimated fastest, failing over to another replica when a
// node is dead, refuses or stalls, within the call's deadline.
//
// The replicated client implements storage::Client, so the pipeline and the adaptive
// fetch use it unchanged. docs/storage-backends.md describes placement, failover and
// when to use it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvstream/membership.hpp"
#include "kvstream/status.hpp"
#include "kvstream/storage.hpp"
#include "kvstream/transport.hpp"

namespace kvstream::cluster {

/// Parses a membership list: one "host:port" per line; '#' starts a comment; blank
/// lines are skipped; surrounding blanks are trimmed. `origin` names the source in
/// error messages (a file name). Errors: invalid_argument naming the line (not
/// host:port, port 0 or above 65535, blanks inside, a duplicate, an empty list).
Result<std::vector<std::string>> parse_membership(std::string_view text, std::string_view origin = "membership");
/// Reads and parses a membership file. Errors: not_found / io_error, and those of
/// parse_membership.
Result<std::vector<std::string>> load_membership(const std::string& path);

/// Consistent-hash ring: each node owns `virtual_nodes` points (xxh3-64 of
/// "address#i"); a key belongs to the nodes of the first points clockwise from its
/// hash, skipping points of nodes already chosen. Adding a node moves to it only keys
/// that it now owns, nothing between the nodes that were there. Not thread-safe.
class HashRing {
 public:
  /// Default points per node (docs/storage-backends.md, "Placement simulation"): a
  /// node that joins 3 takes within 5% of its quarter (256 points: within 10% in 97%
  /// of address sets), max/mean load about 1.05 on 100 nodes; the ring holds 16 KiB
  /// per node (a client keeps 4 rings: 6.5 MB at 100 nodes; prefer 256 from about
  /// 1000 nodes, where the keys' own spread dominates).
  static constexpr uint32_t kDefaultVirtualNodes = cluster::kDefaultVirtualNodes;
  explicit HashRing(uint32_t virtual_nodes = kDefaultVirtualNodes);

  /// Adds a node. Errors: already_exists, invalid_argument (empty address).
  Status add(const std::string& address);
  /// Removes a node. Errors: not_found.
  Status remove(const std::string& address);
  [[nodiscard]] size_t size() const noexcept { return nodes_.size(); }
  [[nodiscard]] const std::vector<std::string>& nodes() const noexcept { return nodes_; }

  /// The min(r, size()) distinct nodes of `key`, in ring order (the first is the
  /// primary). Empty when the ring is.
  [[nodiscard]] std::vector<std::string> replicas(std::string_view key, uint32_t r) const;
  /// The same as indexes into nodes().
  [[nodiscard]] std::vector<uint32_t> replica_indexes(std::string_view key, uint32_t r) const;

  /// The key of one chunk: every level of a chunk lives on the same nodes.
  static std::string chunk_key(std::string_view context, uint32_t chunk);

 private:
  uint32_t vnodes_;
  std::vector<std::string> nodes_;
  std::vector<std::pair<uint64_t, uint32_t>> points_;  // (hash, node index), sorted
  void rebuild();
};

/// Settings of the replicated client (one struct; defaults documented per field).
struct ClusterConfig {
  /// Storage nodes, "host:port". When empty, `membership_file` is read instead.
  std::vector<std::string> nodes;
  std::string membership_file;             ///< one "host:port" per line, '#' comments
  /// Membership from etcd instead (when etcd.endpoints is set; nodes and
  /// membership_file stay empty): the nodes registered there, followed as they join
  /// and leave. After a change, a chunk is read from its new owners and then from
  /// its owners under the last ClusterView::kPastPlacements (3) member sets, which
  /// hold it until the nodes' rebalance has copied it (include/kvstream/membership.hpp).
  /// Each request names the revision of the client's member set; a node whose set is
  /// newer says so (the client's watch is behind), and the client reads the set from
  /// etcd at once: a get that found its chunk nowhere then asks the owners under it,
  /// a put writes to them too before it returns, a stat, listing or remove asks the
  /// members it lacked (docs/protocol.md, "Member sets").
  EtcdConfig etcd;
  uint32_t replication = 2;                ///< R: distinct nodes holding each chunk (capped at the node count)
  /// Replicas that must acknowledge a put: 0 = all R (default). A put that reaches
  /// fewer fails, and the replicas that did take it keep it (a later put replaces it).
  uint32_t write_quorum = 0;
  uint32_t virtual_nodes = HashRing::kDefaultVirtualNodes;  ///< ring points per node
  transport::BackendConfig backend;        ///< every node's backend (default tcp)
  std::string name_space;                  ///< namespace on every node
  std::string secret;                      ///< its secret (the same on every node)
  uint32_t connections_per_node = 1;       ///< connections to each node
  /// Bound on connecting to one node (also at start, in parallel): a node that does
  /// not answer by then is marked down and retried in the background.
  std::chrono::milliseconds connect_timeout{2000};
  /// A node marked down (connection lost, refused, stalled past its attempt's share)
  /// is not asked again, and is reconnected in the background, after this.
  std::chrono::milliseconds retry_down_after{1000};
  /// Shortest per-attempt time: an attempt gets the remaining time divided by the
  /// replicas left to try, but never less than this (nor more than what remains).
  std::chrono::milliseconds min_attempt{50};
  double ewma_weight = 0.25;               ///< weight of a new sample in the per-node latency/throughput EWMA
};

/// Connects to the nodes (in parallel; at least one must answer) and returns a
/// storage::Client over all of them:
///  * put writes the chunk to its R replicas in parallel; ok when `write_quorum`
///    acknowledged (short of it: no_space when every other replica had no space,
///    resource_exhausted when each had no space or no memory, else unavailable or
///    timed_out). put_parts (and put_versioned) the same,
///    with the parts table and one write version (the caller's, or
///    next_write_version()) for every replica.
///  * get_async reads from the replica with the smallest expected time (latency EWMA +
///    bytes in flight and asked for / throughput EWMA; unmeasured nodes first, then
///    ring order) and, when that replica fails (dead, refused, corrupt, stalled past
///    its share of the remaining time), from the next one, into the same buffer,
///    until the deadline. not_found is final only when every live replica says so
///    (and, with etcd, no node it asked knows a newer member set: ClusterConfig::etcd).
///    get_range_async the same, ranking replicas by the range's length and asking
///    each for the range.
///  * stat and list ask every node in parallel and merge; they succeed while fewer
///    than R nodes fail to answer (every chunk then has a replica that answered). A
///    level's parts come from the replica whose size for it was taken (the larger).
///  * remove asks every node; an unreachable node makes it fail (stale replicas would
///    remain), after removing what it could.
/// Errors: invalid_argument (config, membership), permission_denied (a node refused
/// the namespace), unavailable (no node answered), timed_out, cancelled.
Result<std::unique_ptr<storage::Client>> connect(const ClusterConfig& config, transport::Deadline deadline,
                                                 const transport::CancelToken& cancel = {});

}  // namespace kvstream::cluster

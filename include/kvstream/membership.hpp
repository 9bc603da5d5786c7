// Storage-node membership kept in etcd (v3 API through its JSON gateway): nodes
// register themselves under a lease they keep alive, replicated clients and nodes
// watch the set, and after every change the nodes copy chunks to their new owners
// (docs/storage-backends.md, "etcd membership").
//
// Keys under EtcdConfig::prefix:
//   <prefix>nodes/<host:port>      a live node (value: its address), under its lease
//   <prefix>migration/<host:port>  the node's last rebalance (JSON, MigrationReport),
//                                  under the same lease
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvstream/status.hpp"
#include "kvstream/transport.hpp"

namespace kvstream::cluster {

/// Where membership lives (one struct; defaults documented per field). Membership is
/// off while `endpoints` is empty.
struct EtcdConfig {
  /// etcd client URLs ("http://127.0.0.1:2379"), tried in turn until one answers,
  /// starting at the one that answered last (one that did not is passed over by the
  /// calls after it).
  std::vector<std::string> endpoints;
  /// Key prefix of this cluster (several clusters may share one etcd).
  std::string prefix = "/kvstream/";
  /// A node's lease: a node that has not renewed it for this long (crashed, cut off)
  /// leaves the membership. Renewed every third of it.
  std::chrono::seconds lease_ttl{5};
  /// Bound on one etcd request to one endpoint (a watch is a stream and has none; it
  /// is cancelled instead). A call's own deadline is shared among the endpoints not
  /// tried yet, so a member that takes the connection and never answers (a frozen
  /// process) does not use up a lease renewal's time before a live one is asked.
  std::chrono::milliseconds request_timeout{2000};
};

/// The ring points per node that nodes (RebalanceConfig) and clients (ClusterConfig,
/// HashRing) default to: one constant, so both place every chunk on the same nodes
/// (why 1024: HashRing, cluster.hpp).
inline constexpr uint32_t kDefaultVirtualNodes = 1024;

/// A storage node's part in etcd membership (ServerConfig::membership; off while
/// etcd.endpoints is empty). The node registers `advertise` under a lease and follows
/// the member set. After every change it copies each chunk it holds and is the sender
/// of to the chunk's new owners: the sender is the first of the chunk's owners under
/// the last member set the node finished rebalancing for that is still a member, and
/// the new owners are those under the new set that were not owners before. Copies
/// keep their write version, so a newer write that reached an owner first wins. The
/// removes a node remembers (ServerConfig::remove_memory) go to the nodes that joined,
/// from the owners of each context's first chunk under the set before, so a node that
/// comes back drops its copies of contexts removed while it was away.
struct RebalanceConfig {
  EtcdConfig etcd;
  /// The address clients and other nodes reach this node at; default: the address it
  /// listens on (which must then be a concrete host, not a wildcard).
  std::string advertise;
  /// R and the ring's points per node: as the clients' ClusterConfig, so nodes and
  /// clients place every chunk on the same nodes.
  uint32_t replication = 2;
  uint32_t virtual_nodes = kDefaultVirtualNodes;
  /// Bound on the copy rate of one node (bytes of chunks per second; 0: none), so a
  /// rebalance leaves room for the traffic of serving.
  uint64_t bytes_per_second = uint64_t(64) << 20;
  /// Changes that arrive within this of each other are rebalanced as one.
  std::chrono::milliseconds settle{300};
  /// Drop the copies this node holds of chunks it no longer owns (left behind when a
  /// change gave them new owners), once every member has finished copying for the
  /// new set and each owner holds the same write or a newer one; a copy an owner
  /// lacks (or holds an older write of) is sent to it first. Runs after each finished
  /// pass and once at start (the node may have been away while its chunks moved).
  /// false: keep them (space for R+1 copies of the chunks that moved; a write that
  /// reached only old owners stays there, read only while a rebalance runs). Either
  /// way a node that (re)joins serves what it held only once the members have handed
  /// it the removes made while it was out (docs/protocol.md, "Removes").
  bool trim_surplus = true;
  /// After a pass that left objects uncopied (an owner unreachable or out of space),
  /// the next pass waits retry_first, and each further one twice as long, up to
  /// retry_max; a new membership change starts one at once. A retry pass sends only
  /// the objects no earlier pass for the same change delivered.
  std::chrono::milliseconds retry_first{1000};
  std::chrono::milliseconds retry_max{60000};
};

/// What a node reports about its last rebalance (the copy of chunks to their new owners
/// after a membership change), read back by migration_reports.
struct MigrationReport {
  std::string node;                  ///< the reporting node
  std::vector<std::string> members;  ///< the membership the rebalance placed chunks for (sorted)
  /// The etcd revision of the newest registration among `members` (a node's key in
  /// <prefix>nodes/, put anew when it starts or registers again after its lease ran
  /// out). A report for the same addresses with a smaller figure was made before that
  /// node's return, and its removes were not handed to it then. 0: not said (a node
  /// from before this).
  int64_t members_revision = 0;
  bool done = false;                 ///< every chunk this node had to copy was copied
  uint64_t objects_copied = 0;       ///< objects (levels of chunks) this node sent to new owners
  uint64_t bytes_copied = 0;
  uint64_t objects_present = 0;      ///< sent, but the owner already held that write (or a newer one)
  uint64_t objects_failed = 0;       ///< not copied (owner unreachable or out of space); retried at the next pass
  double seconds = 0;                ///< from the membership change to done (or to now)
  /// The copies of chunks this node no longer owns under `members` were dealt with:
  /// dropped (objects_trimmed; those an owner lacked were sent to it first), or kept
  /// (objects_kept).
  bool trimmed = false;
  uint64_t objects_trimmed = 0;  ///< copies dropped: each owner held that write or a newer one, or took it
  uint64_t bytes_trimmed = 0;
  /// Copies sent to an owner that lacked that write or held an older one (one per
  /// owner), before the drop: writes a client with an older member set made to old
  /// owners only, or copies an owner lost.
  uint64_t objects_handed_over = 0;
  uint64_t bytes_handed_over = 0;
  /// Copies kept: an owner does not say its versions (a node from before them), or
  /// refused the write (out of space).
  uint64_t objects_kept = 0;
  /// Removes this node remembered and handed to nodes that joined (so one that comes
  /// back with copies made before a remove drops them; ServerConfig::remove_memory).
  uint64_t removes_handed_on = 0;
  /// Per namespace, the time (ms since the Unix epoch) after which every remove this
  /// node was sent is remembered: `ServerConfig::remove_memory` ago, or later where
  /// removes were pushed out past `max_removes_remembered`. A node back from an
  /// absence that began before it drops what it held of that namespace's contexts
  /// that no other member holds (a context removed meanwhile) instead of serving them.
  /// Absent: the node remembers no removes (or is from before this).
  std::map<std::string, int64_t> removes_complete_since_ms;
};

/// The members registered now (sorted). Errors: unavailable (no endpoint answered),
/// timed_out, cancelled, invalid_argument (config).
Result<std::vector<std::string>> current_members(const EtcdConfig& config, transport::Deadline deadline,
                                                 const transport::CancelToken& cancel = {});

/// Every live node's last MigrationReport. Errors: as current_members, and
/// corrupt_data for a report that does not parse.
Result<std::vector<MigrationReport>> migration_reports(const EtcdConfig& config, transport::Deadline deadline,
                                                       const transport::CancelToken& cancel = {});

}  // namespace kvstream::cluster

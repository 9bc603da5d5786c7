// The replicated client's connections to its storage nodes: made at start and when a
// node joins, retired when a call finds the node dead or broken, remade in the
// background, and destroyed only once their last user is done and never on one of
// their own threads (a node client's callbacks run on its receiver thread, which
// cannot join itself). The placement, the reads and the writes stay in the client.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "storage/cluster/cluster_view.hpp"
#include "storage/members_link.hpp"

namespace kvstream::cluster {

class NodeLinks {
 public:
  /// `members` names the nodes to keep connected (the client's current view); it is
  /// called on the maintenance thread. `cfg` is the client's and outlives this. Every
  /// node's client is made on `backend` (the client's) and shares `set` (its requests
  /// name the client's member set; null with a static list of nodes).
  NodeLinks(const ClusterConfig& cfg, std::shared_ptr<transport::Backend> backend,
            std::function<std::vector<ClusterNode*>()> members, std::shared_ptr<storage::MembersLink> set);
  NodeLinks(const NodeLinks&) = delete;
  NodeLinks& operator=(const NodeLinks&) = delete;
  /// Stops the maintenance thread if stop() did not.
  ~NodeLinks();

  /// Starts reconnecting nodes that are down in the background.
  void start_maintenance();

  /// Connects `n` (replacing a connection it had). On failure the node is retried
  /// after retry_down_after.
  Status connect(ClusterNode& n, transport::Deadline deadline, const transport::CancelToken& cancel);
  /// connect() bounded by connect_timeout, ended early by stop().
  Status reconnect(ClusterNode& n);

  /// The node's connection, or null while it has none. A caller holds it for the
  /// length of one call.
  std::shared_ptr<storage::Client> client_of(ClusterNode& n);

  /// Drops a node's connection (dead or broken) if it is still `c`, marks the node
  /// down and reconnects it in the background.
  void retire(ClusterNode& n, const storage::Client* c, const Status& why);

  /// A node that left the cluster: its connection is closed, and not remade.
  void let_go(ClusterNode& n);

  /// Ends a connect in progress and the maintenance thread; from here on connects
  /// fail as cancelled and closing() is true.
  void stop();
  /// True once stop() began: calls in flight finish as cancelled.
  bool closing();

  /// stop() (if not done yet), then closes every connection of `nodes` and those
  /// retired (pending gets complete with their errors; the caller's callbacks see
  /// closing()).
  void close(const std::vector<std::unique_ptr<ClusterNode>>& nodes);

 private:
  void maintain();
  void bury(std::shared_ptr<storage::Client> c);
  static void destroy_when_unique(std::shared_ptr<storage::Client> c);

  const ClusterConfig& cfg_;
  std::shared_ptr<transport::Backend> backend_;
  std::function<std::vector<ClusterNode*>()> members_;
  std::shared_ptr<storage::MembersLink> set_;
  transport::CancelToken stop_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closing_ = false;
  std::thread maintenance_;
  std::vector<std::shared_ptr<storage::Client>> graveyard_;  // retired clients, guarded by mu_
};

}  // namespace kvstream::cluster

// The connections a node's rebalance makes to the other nodes: one storage client per
// (tenant, node), all on one backend made at the first use, so a pass costs one
// endpoint or worker rather than one per tenant and node.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "kvstream/storage.hpp"
#include "storage/node/chunk_store.hpp"

namespace kvstream::cluster {

class PeerClients {
 public:
  /// `secrets`: the node's namespaces (it logs into other nodes as each tenant);
  /// `stop` cancels connecting. All must outlive this.
  PeerClients(const std::string& self, const transport::BackendConfig& backend,
              const std::map<std::string, std::string>& secrets, const transport::CancelToken& stop)
      : self_(self), backend_config_(backend), secrets_(secrets), stop_(stop) {}

  /// The client of `node` for tenant `ns`, connected at the first call; null when it
  /// could not be made (logged once), and from then on for this object's life: a node
  /// that does not answer is not asked again in the same pass.
  storage::Client* get(const std::string& ns, const std::string& node);
  /// `node` failed mid-pass (unavailable, timed out): its client goes, and get() now
  /// answers null for it.
  void drop(const std::string& ns, const std::string& node);
  /// Writes this node's stored object `key` to `node` as the write it is (one stored
  /// without a version goes as the oldest write, so any write the owner has wins):
  /// already_exists where the owner holds that write or a newer one. A node that does
  /// not answer (unavailable, timed out) is dropped.
  Status send(const storage::ObjectKey& key, const storage::ChunkStore::StoredObject& obj, const std::string& node);

 private:
  const std::string& self_;
  const transport::BackendConfig& backend_config_;
  const std::map<std::string, std::string>& secrets_;
  const transport::CancelToken& stop_;
  std::shared_ptr<transport::Backend> backend_;  // outlives the clients (declared first)
  std::map<std::pair<std::string, std::string>, std::unique_ptr<storage::Client>> clients_;
  std::set<std::pair<std::string, std::string>> unreachable_;
};

}  // namespace kvstream::cluster

// One get of a replicated client, carried from replica to replica: the owners now,
// best first; then, when none had the chunk, its owners under the past placements;
// then, once, its owners under a newer member set (cluster/replicated_client.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kvstream/storage.hpp"
#include "storage/cluster/cluster_view.hpp"

namespace kvstream::cluster {

struct GetOp {
  std::string context;
  uint32_t chunk = 0, level = 0;
  transport::MemoryRegion dest;
  size_t offset = 0, capacity = 0;  // a range: its place in dest, its length
  bool range = false;               // a range get of [range_offset, range_offset + capacity)
  uint64_t range_offset = 0;
  transport::Deadline deadline;
  transport::CancelToken cancel;
  storage::GetCallback done;
  std::vector<ClusterNode*> order;  // replicas, best first
  size_t next = 0;
  // The view the get started with; its past owners are asked only when the owners
  // now did not answer with the chunk (after a membership change), so a get on a
  // settled cluster computes no past placement.
  std::shared_ptr<const ClusterView> view;
  std::string key;
  bool asked_past = false;
  bool asked_again = false;  // once, after the member set moved (ReplicatedClient::ask_again)
  std::string errors;  // "node: error; ..." of the attempts that failed
  Status last_error;
  bool only_not_found = true;
};

}  // namespace kvstream::cluster

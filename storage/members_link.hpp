// What a replicated client and the clients of its nodes share about the member set
// (docs/protocol.md, "Member sets"): the etcd revision the client's set is current
// as of, which each request to a node that checks it carries (kMembersRevision), and
// the answers of nodes whose own set is newer (Response::members_newer). Those mean
// the client's etcd watch is behind (a frozen or slow member): it may place chunks
// on nodes that no longer own them and miss nodes that joined, so it reads the set
// again and asks those too.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "kvstream/storage.hpp"

namespace kvstream::storage {

class MembersLink {
 public:
  /// Called (on a connection's receiver thread, so it must not block) when a node
  /// answered that its set is newer than `told - 1`, the revision the request named.
  /// Set before the link is shared; may be empty.
  std::function<void(int64_t told)> on_newer;

  /// The etcd revision the client's member set is current as of, read as each request
  /// is sent; 0: none yet (requests name none).
  [[nodiscard]] int64_t revision() const { return revision_.load(std::memory_order_acquire); }
  /// Raises revision() to `revision` (a no-op for an older one). Called once the
  /// client's placement reflects that set, never before.
  void set_revision(int64_t revision) { raise(revision_, revision); }

  /// The highest `told` so far: some node's set is at least this new.
  [[nodiscard]] int64_t newer_than_told() const { return told_.load(std::memory_order_acquire); }
  /// A node answered that its set is newer than `sent`.
  void node_is_newer(int64_t sent) {
    raise(told_, sent + 1);
    if (on_newer) on_newer(sent + 1);
  }

 private:
  static void raise(std::atomic<int64_t>& a, int64_t v) {
    int64_t seen = a.load(std::memory_order_relaxed);
    while (v > seen && !a.compare_exchange_weak(seen, v, std::memory_order_acq_rel)) {
    }
  }
  std::atomic<int64_t> revision_{0}, told_{0};
};

/// A node's client whose requests name the member set of `link` to a node that
/// declares kFeatureMembersCheck, and that tells `link` of the answers that say the
/// node's set is newer (the replicated client's node clients).
Result<std::unique_ptr<Client>> connect_following_members(const ClientConfig& config,
                                                          std::shared_ptr<transport::Backend> backend,
                                                          std::shared_ptr<MembersLink> link,
                                                          transport::Deadline deadline,
                                                          const transport::CancelToken& cancel = {});

}  // namespace kvstream::storage

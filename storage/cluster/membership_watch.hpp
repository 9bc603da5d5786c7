// Follows the storage nodes registered in etcd (<prefix>nodes/): reads the set once,
// then watches it from the next revision on its own thread, and reports every change
// of the set (a node that left and came back within one watch response too:
// member_steps). After a broken watch (etcd restarted, compaction) it reads the set again
// and resumes, every 500 ms until etcd answers; the set it last saw stays in force
// meanwhile.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "storage/cluster/etcd_client.hpp"

namespace kvstream::cluster {

/// The sets (etcd key -> node address) one watch response's `events` lead `by_key`
/// through that a follower must see: the last, and before it the set just before
/// each put of a key the same response deleted. A node whose lease ran out and that
/// registered again at once comes as a delete and a put together; reported as the
/// end state alone, it would look like no change, and the removes made while it was
/// out would not be handed to it (Rebalancer::hand_on_removes).
std::vector<std::map<std::string, std::string>> member_steps(std::map<std::string, std::string> by_key,
                                                             const std::vector<EtcdEvent>& events);

class MembershipWatch {
 public:
  /// Called on the watch's thread with the new member set (sorted addresses) and the
  /// etcd revision it was read at; never with the lock of this object held.
  using OnChange = std::function<void(const std::vector<std::string>& members, int64_t revision)>;

  /// Reads the set by `deadline` (returned by members() at once; `on_change` is not
  /// called for it) and starts watching. Errors: those of the first read.
  static Result<std::unique_ptr<MembershipWatch>> start(EtcdClient etcd, OnChange on_change,
                                                        transport::Deadline deadline,
                                                        const transport::CancelToken& cancel = {});
  /// Stops the watch (within about a second: libcurl's progress interval).
  ~MembershipWatch();

  [[nodiscard]] std::vector<std::string> members() const;
  [[nodiscard]] int64_t revision() const;

 private:
  MembershipWatch(EtcdClient etcd, OnChange on_change) : etcd_(std::move(etcd)), on_change_(std::move(on_change)) {}
  void run();
  // Replaces the whole set (a fresh read); reports it when it differs.
  void reset(std::map<std::string, std::string> by_key, int64_t revision);

  EtcdClient etcd_;
  OnChange on_change_;
  transport::CancelToken stop_;
  mutable std::mutex mu_;
  std::map<std::string, std::string> by_key_;  // etcd key -> node address
  int64_t revision_ = 0;
  std::thread thread_;
};

}  // namespace kvstream::cluster

// A storage node's entry in etcd: <prefix>nodes/<address> under a lease that a thread
// renews every third of its TTL. A node cut off from etcd for longer than the TTL
// loses the entry (the others drop it); when it reaches etcd again it registers under
// a new lease. Other keys of the node (its migration report) live under the same
// lease, so they leave with it. Destruction revokes the lease: the node leaves now.
// A node whose lease ran out is told before it registers again (Hooks::before_rejoin).
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "storage/cluster/etcd_client.hpp"

namespace kvstream::cluster {

class NodeRegistration {
 public:
  /// What the node is told of its membership.
  struct Hooks {
    /// Called after the registration (on the caller's thread) and after each renewal
    /// that finds the lease alive (on the renewing thread): the node is a member then
    /// (the store's member mark).
    std::function<void()> on_member;
    /// Called on the renewing thread before the node registers again after its lease
    /// ran out, with how long since it was last known a member: the others dropped it
    /// meanwhile, and removes made then did not reach it (the store's fence).
    std::function<void(transport::Clock::duration away)> before_rejoin;
  };
  /// Registers `address` by `deadline`. Errors: those of the etcd calls.
  static Result<std::unique_ptr<NodeRegistration>> start(EtcdClient etcd, std::string address,
                                                         transport::Deadline deadline, Hooks hooks = {});
  ~NodeRegistration();

  /// Puts <prefix><what>/<address> = value under the node's lease (and again after
  /// every re-registration, until replaced).
  Status publish(const std::string& what, const std::string& value, transport::Deadline deadline);

 private:
  NodeRegistration(EtcdClient etcd, std::string address, Hooks hooks)
      : etcd_(std::move(etcd)), address_(std::move(address)), hooks_(std::move(hooks)) {}
  Status register_now(transport::Deadline deadline);
  void renew();

  EtcdClient etcd_;
  const std::string address_;
  const Hooks hooks_;
  transport::CancelToken stop_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  int64_t lease_ = 0;
  std::map<std::string, std::string> published_;  // what -> value, put again under a new lease
  std::thread thread_;
};

}  // namespace kvstream::cluster

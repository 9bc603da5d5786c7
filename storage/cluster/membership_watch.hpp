// Follows the storage nodes registered in etcd (<prefix>nodes/): reads the set once,
// then watches it from the next revision on its own thread, and reports every change
// of the set (a node that left and came back within one watch response, or that
// registered again, too: member_steps). After a broken watch (etcd restarted,
// compaction) it reads the set again and resumes, every 500 ms until etcd answers; the
// set it last saw stays in force meanwhile.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "storage/cluster/etcd_client.hpp"

namespace kvstream::cluster {

/// A node's entry as the watch sees it: its address, and the etcd revision it
/// registered at (its key's mod_revision). A node that registers again (its lease ran
/// out, or it restarted) has a new one: the same address is then another incarnation,
/// which missed the removes made while it was out.
struct Registration {
  std::string address;
  int64_t revision = 0;
  bool operator==(const Registration&) const = default;
};
using Registrations = std::map<std::string, Registration>;  // etcd key -> entry

/// A member set: the nodes' addresses (sorted) and when each registered.
struct MemberSet {
  std::vector<std::string> nodes;
  std::map<std::string, int64_t> registered;  // address -> revision of its registration
  /// The newest registration among them (0 for none). A rebalance report carries it:
  /// a report for the same addresses with a smaller figure is from before one of them
  /// registered again.
  [[nodiscard]] int64_t newest() const;
  bool operator==(const MemberSet&) const = default;
};
MemberSet member_set(const Registrations& by_key);

/// The sets one watch response's `events` lead `by_key` through that a follower must
/// see: the last, and before it the set without each node that registered again in
/// it (a put of a key the same response deleted, or that was there already). A node
/// whose lease ran out and that registered again at once comes as a delete and a put
/// together, a node restarted within its lease as a put alone; reported as the end
/// state alone, either would look like no change, and the removes made while it was
/// out would not be handed to it (Rebalancer::hand_on_removes).
std::vector<Registrations> member_steps(Registrations by_key, const std::vector<EtcdEvent>& events);

class MembershipWatch {
 public:
  /// Called on the watch's thread with the new member set; never with the lock of this
  /// object held.
  using OnChange = std::function<void(const MemberSet& members)>;
  /// Called with revision() each time it moves (after the change, if any, was
  /// reported), on the thread that moved it; may be empty.
  using OnRevision = std::function<void(int64_t revision)>;

  /// Reads the set by `deadline` (returned by members() at once; `on_change` is not
  /// called for it, nor `on_revision` for its revision) and starts watching. Errors:
  /// those of the first read.
  static Result<std::unique_ptr<MembershipWatch>> start(EtcdClient etcd, OnChange on_change,
                                                        transport::Deadline deadline,
                                                        const transport::CancelToken& cancel = {},
                                                        OnRevision on_revision = {});
  /// Stops the watch (within about a second: libcurl's progress interval).
  ~MembershipWatch();

  [[nodiscard]] MemberSet members() const;
  /// The etcd revision the set is current as of. It moves after on_change returns: a
  /// follower's state set in on_change is at least as new as the revision read before it.
  [[nodiscard]] int64_t revision() const;

  /// Reads the set now instead of waiting for the watch (which may be behind: a slow
  /// or frozen etcd member; the watch's thread does so too after its stream broke),
  /// and reports it as the watch would when it is newer than what the watch brought,
  /// as member_steps of what changed; the stream then skips the events it covered.
  /// Where the read found a change the stream had not brought, the stream starts
  /// again (within about a second), at the endpoint that answered the read.
  /// Errors: those of the read (the set stays as it was).
  Status catch_up(transport::Deadline deadline, const transport::CancelToken& cancel = {});

 private:
  MembershipWatch(EtcdClient etcd, OnChange on_change, OnRevision on_revision)
      : etcd_(std::move(etcd)), on_change_(std::move(on_change)), on_revision_(std::move(on_revision)) {}
  void run();
  // Replaces the whole set; reports it when it differs.
  void reset(Registrations by_key, int64_t revision);
  // Moves revision() (step_mu_ held).
  void advance(int64_t revision, bool read);

  EtcdClient etcd_;
  OnChange on_change_;
  OnRevision on_revision_;
  transport::CancelToken stop_;
  transport::CancelToken stream_;  // the stream's own (guarded by mu_): stop and restarts end it
  bool restart_ = false;           // the stream was ended to start again (guarded by mu_)
  // Held while the set moves and the change is reported (the watch's thread and
  // catch_up): reports arrive one at a time, in the order of their revisions.
  std::mutex step_mu_;
  mutable std::mutex mu_;
  Registrations by_key_;
  // Written under mu_ (and step_mu_); read without a lock by revision(), which a
  // storage node asks for each request that names a member set.
  std::atomic<int64_t> revision_{0};
  int64_t read_revision_ = 0;  // of the last read of the whole set (a stream's older events skipped)
  std::thread thread_;
};

}  // namespace kvstream::cluster

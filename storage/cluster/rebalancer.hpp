// A storage node's membership agent: it registers the node in etcd, follows the member
// set, and after each change copies the chunks this node is the sender of to their new
// owners, at a bounded rate, reporting progress under <prefix>migration/<node>
// (include/kvstream/membership.hpp describes who sends what).
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <vector>

#include "kvstream/cluster.hpp"
#include "kvstream/membership.hpp"
#include "kvstream/storage.hpp"
#include "storage/cluster/member_catch_up.hpp"
#include "storage/cluster/membership_watch.hpp"
#include "storage/cluster/node_registration.hpp"
#include "storage/cluster/wait_warning.hpp"
#include "storage/node/chunk_store.hpp"

namespace kvstream::cluster {

class PeerClients;

class Rebalancer {
 public:
  /// Registers `self` and starts following membership. `store` and `budget` (the
  /// node's memory budget: an object being copied is held under it) must outlive the
  /// rebalancer; `secrets` are the node's namespaces (it writes to other nodes as each
  /// tenant); `backend` is the transport of the cluster's nodes. Errors:
  /// invalid_argument (config), and those of etcd.
  static Result<std::unique_ptr<Rebalancer>> start(const RebalanceConfig& config, std::string self,
                                                   storage::ChunkStore& store, storage::MemoryBudget& budget,
                                                   std::map<std::string, std::string> secrets,
                                                   transport::BackendConfig backend);
  /// Stops copying, stops the watch and leaves the membership (revokes the lease).
  ~Rebalancer();

  /// A client's write of `key` committed here. A write of a chunk this node does not
  /// own under the newest member set it knows came from a client whose set is older
  /// (its etcd watch behind or cut off): its context is looked at again soon, and the
  /// write handed to the chunk's owners (the surplus trim, scoped to those contexts).
  /// Cheap; called on the node's request threads.
  void on_write(const storage::ObjectKey& key);

  /// The etcd revision the member set this node follows is current as of: a request
  /// that names an older one comes from a client whose set is behind, and the node's
  /// answer says so (docs/protocol.md, "Member sets"). Cheap; called on the node's
  /// request threads.
  [[nodiscard]] int64_t members_revision() const;
  /// A client's request named a set as of `revision`, newer than this node's: its own
  /// watch may be behind (its etcd member frozen), so the set is read again in the
  /// background (reads shared and spaced, cluster/member_catch_up.hpp). Cheap; called
  /// on the node's request threads.
  void heard_of_newer_members(int64_t revision);

 private:
  Rebalancer(RebalanceConfig cfg, std::string self, storage::ChunkStore& store, storage::MemoryBudget& budget,
             std::map<std::string, std::string> secrets, transport::BackendConfig backend)
      : cfg_(std::move(cfg)), self_(std::move(self)), store_(store), budget_(budget), secrets_(std::move(secrets)),
        backend_(std::move(backend)), target_{{}, HashRing(cfg_.virtual_nodes)} {}

  struct Tally {
    uint64_t objects_copied = 0, bytes_copied = 0, objects_present = 0, objects_failed = 0;
    uint64_t objects_trimmed = 0, bytes_trimmed = 0, objects_kept = 0;
    uint64_t objects_handed_over = 0, bytes_handed_over = 0;
    uint64_t removes_handed_on = 0;
  };
  enum class TrimResult {
    finished,  ///< every surplus copy dropped, or kept for a reason counted in objects_kept
    again,     ///< a member has not finished copying, or an owner did not answer
    cut,       ///< a newer change (or stop)
  };
  enum class HandOver {
    delivered,  ///< every owner took the write or holds a newer one
    gone,       ///< the copy went meanwhile (removed)
    refused,    ///< an owner refused it (out of space): the copy stays
    again,      ///< an owner did not answer, no memory, or a write landed here since
    cut,        ///< a newer change (or stop)
  };
  // A member set as the passes use it: the set (its nodes and when each registered)
  // and its ring, built once per change.
  struct Members {
    MemberSet set;
    HashRing ring;
  };
  Members members_of(const MemberSet& set) const;
  void on_change(const MemberSet& members);
  // Whether this node owns the chunk under the newest member set it knows (true
  // before it knows one); on_write asks it.
  [[nodiscard]] bool owned_locked(const std::string& chunk_key) const;
  // A change for the worker: a new generation, a pass after `settle`. Requires mu_.
  void changed_locked();
  void run();
  // One pass from the member set of `settled` to that of `target` (their rings) for
  // change `gen`; false when a newer change (or stop) cut it short.
  // `bounced`: nodes that left a member set seen since `settled` (they join again).
  bool pass(const HashRing& settled, const HashRing& target, const std::set<std::string>& bounced, Tally& tally,
            uint64_t gen);
  void report(const Members& target, bool done, const Tally& tally, double seconds, bool trimmed = false);
  // Drops the copies this node holds of chunks it does not own under `members`, once
  // every member reports its copies for that set done and each owner holds the same
  // write or a newer one (storage/cluster/surplus_copies.hpp); counts into `tally`.
  // Lifts the store's fence first (settle_fence), once every other member's report
  // is for a set with this node's registration in it. `only`: the (namespace,
  // context) pairs to look at; null: every context.
  TrimResult trim(const Members& members, uint64_t gen, Tally& tally,
                  const std::set<std::pair<std::string, std::string>>* only = nullptr);
  // Sends this node's copy of `key` (write `version`, `bytes` long) to the owners in
  // `to`, which lack it or hold an older write; those that took it join `received`.
  HandOver hand_over(PeerClients& peers, const storage::ObjectKey& key, uint64_t version, uint64_t bytes,
                     const std::vector<std::string>& to, uint64_t gen, Tally& tally, std::set<std::string>& received);
  // The removes this node remembers go to the nodes that joined between `before` and
  // `after` (one may come back with copies made before them), and to those of
  // `bounced` in `after` (dropped and back between two passes: a client may have sent
  // a remove to the others meanwhile): from the owners of each context's first chunk
  // under `before` without `bounced`. Those not delivered count as failed (the pass
  // is retried); false when a newer change (or stop) cut it short.
  static constexpr uint32_t kRemoveDelivery = ~uint32_t(0);  // chunk and level of a remove's delivery id
  bool hand_on_removes(PeerClients& peers, const HashRing& before, const HashRing& after,
                       const std::set<std::string>& bounced, Tally& tally, uint64_t gen);
  // The use mark of `ctx` goes with objects sent to `to`, so an evictor there sees the
  // context as used when it was (a copy otherwise looks unused and goes first).
  void send_use_mark(PeerClients& peers, const std::string& ns, const std::string& ctx,
                     const std::set<std::string>& to);
  // Per namespace, when this node's memory of removes begins (ms since the epoch;
  // ChunkStore::removes_complete_since), for its reports.
  std::map<std::string, int64_t> removes_complete_since();
  // Per namespace, the latest time before which one of the others whose `reports`
  // these are may have forgotten a remove (their removes_complete_since_ms).
  std::map<std::string, std::chrono::system_clock::time_point> horizons_of(
      const std::vector<MigrationReport>& reports) const;
  // Lifts the store's fence: every member of `members` (their `reports`) has handed
  // this node its removes. Where one may have forgotten a remove of a namespace since
  // this node was last a member (ChunkStore::forgotten_namespaces), each context of it
  // held behind the fence that no other member holds goes first (a removed one; a live
  // one is held by its other owners, and stays). False when a member did not answer
  // (the fence stays, for the next trim).
  bool settle_fence(const HashRing& members, const std::vector<MigrationReport>& reports);
  // A fenced node's trim waits on the members `whom` (`why`): said at warn once the
  // fence has been up for kFenceWaitWarn, and again each kFenceWaitWarn (a member whose
  // pass cannot finish, or whose watch is stuck, keeps the node from serving what it
  // held).
  void fence_waits(const std::vector<std::string>& whom, std::string_view why);
  static constexpr std::chrono::seconds kFenceWaitWarn{30};
  // Before the node registers again after its lease ran out (NodeRegistration::Hooks):
  // the store fences, or drops, what it holds, and a pass and a trim follow.
  void before_rejoin(transport::Clock::duration away);
  // Whether change `gen` is still the newest and the node is not stopping.
  bool current(uint64_t gen);
  // Waits out the rate bound after `bytes` more; false when stopping or when a change
  // newer than `gen` arrived.
  bool pace(uint64_t bytes, uint64_t gen);

  RebalanceConfig cfg_;
  const std::string self_;
  storage::ChunkStore& store_;
  storage::MemoryBudget& budget_;
  const std::map<std::string, std::string> secrets_;
  const transport::BackendConfig backend_;
  transport::CancelToken stop_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  // The newest member set (its ring built once per change), copied by the passes and
  // the trims; on_write reads its ring.
  Members target_;
  // Contexts written here by clients with an older member set (on_write), waiting for
  // a scoped trim; past kMaxStrays of them, the next trim looks at every context.
  static constexpr size_t kMaxStrays = 4096;
  // How often a fenced node's due trim looks at the members' reports.
  static constexpr std::chrono::milliseconds kFencePoll{200};
  static constexpr std::chrono::milliseconds kCatchUpSpacing{200};  // reads of the set on clients' word
  std::set<std::pair<std::string, std::string>> strays_;
  bool strays_overflow_ = false;
  uint64_t generation_ = 0;          // bumped at each change
  // Members of a set seen since the last finished pass that a later set lacked: those
  // back in the newest set missed the removes made while they were out.
  std::set<std::string> left_since_pass_;
  transport::Clock::time_point changed_at_{};
  // The rate bound's account of the current pass.
  transport::Clock::time_point pace_start_{};
  uint64_t paced_bytes_ = 0;
  // The worker's alone: what the passes for change delivered_gen_ delivered (a hash
  // of namespace, context, chunk, level and owner: copied, or found there), so that a
  // retry pass sends only what is still missing.
  uint64_t delivered_gen_ = 0;
  std::unordered_set<uint64_t> delivered_;
  // The worker's alone: how long a fenced node's trims have waited on members, and
  // when that is said (fence_waits).
  WaitWarning fence_wait_{kFenceWaitWarn};

  std::unique_ptr<NodeRegistration> registration_;
  std::unique_ptr<MembershipWatch> watch_;
  std::unique_ptr<MemberCatchUp> catch_up_;  // reads of the set on clients' word (stopped before the watch goes)
  std::thread worker_;
};

}  // namespace kvstream::cluster

// The replicated client behind cluster::connect (include/kvstream/cluster.hpp,
// docs/storage-backends.md): one storage::Client per node, chunks placed on R nodes by
// the hash ring, reads from the replica estimated fastest with failover within the
// deadline. Its parts: replicated_client.cpp (connecting, the member set, writes and
// the calls that ask every node) and replicated_get.cpp (a get's replicas, its
// attempts and its failover).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvstream/cluster.hpp"
#include "storage/cluster/cluster_view.hpp"
#include "storage/cluster/get_op.hpp"
#include "storage/cluster/member_catch_up.hpp"
#include "storage/cluster/membership_watch.hpp"
#include "storage/cluster/node_links.hpp"
#include "storage/backend_client.hpp"
#include "storage/members_link.hpp"

namespace kvstream::cluster {

// Every node's client is on the one backend (BackendClient's): one endpoint or worker,
// and one registration of each caller's buffer, however many nodes there are, so a
// region registered here serves gets from any replica as it is.
class ReplicatedClient final : public storage::BackendClient {
  using CancelToken = transport::CancelToken;
  using Clock = transport::Clock;
  using Deadline = transport::Deadline;
  using MemoryRegion = transport::MemoryRegion;
  using ChunkStat = storage::ChunkStat;
  using GetCallback = storage::GetCallback;
  using Node = ClusterNode;

 public:
  ~ReplicatedClient() override;

  // Checks `cfg`, reads the member set from etcd where it names endpoints (and follows
  // it from then on), and connects to every node in parallel: at least one must
  // answer; the others are tried again in the background.
  static Result<std::unique_ptr<storage::Client>> create(ClusterConfig cfg, Deadline deadline,
                                                         const CancelToken& cancel);

  // Every replica gets the bytes, the parts and one write version.
  Status put_parts(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                   std::span<const storage::ObjectPart> parts, uint64_t version, Deadline deadline,
                   const CancelToken& cancel) override;

  void get_async(const std::string& context, uint32_t chunk, uint32_t level, MemoryRegion dest, size_t offset,
                 size_t capacity, Deadline deadline, const CancelToken& cancel, GetCallback done) override;

  // As get_async: the replica expected fastest for `length` bytes, then the others.
  void get_range_async(const std::string& context, uint32_t chunk, uint32_t level, uint64_t offset, uint64_t length,
                       MemoryRegion dest, size_t dest_offset, Deadline deadline, const CancelToken& cancel,
                       GetCallback done) override;

  Result<std::vector<ChunkStat>> stat(const std::string& context, Deadline deadline,
                                      const CancelToken& cancel) override;

  // remove_up_to at this process's clock now: one version for every node, so each
  // remembers the same remove.
  Status remove(const std::string& context, Deadline deadline, const CancelToken& cancel) override;

  // Every member is asked, as a remove must reach every copy (past owners' too); each
  // remembers it, whether it held the context or not.
  Status remove_up_to(const std::string& context, uint64_t version, Deadline deadline,
                      const CancelToken& cancel) override;

  Result<std::vector<std::string>> list(Deadline deadline, const CancelToken& cancel) override;

  // Every node is told: one message each, and a node that does not hold a context
  // passes it over, so copies on past owners are marked too.
  Status touch(std::span<const storage::ContextTouch> contexts, uint64_t stamp, Deadline deadline,
               const CancelToken& cancel) override;

  // Per context: the larger size and the newest marks of any replica, the union of
  // their chunks.
  Result<std::vector<storage::ContextUsage>> usage(const std::string& prefix, Deadline deadline,
                                                   const CancelToken& cancel) override;

 private:
  static double seconds_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }

  ReplicatedClient(ClusterConfig cfg, std::shared_ptr<transport::Backend> backend)
      : BackendClient(std::move(backend)),
        cfg_(std::move(cfg)),
        set_link_(cfg_.etcd.endpoints.empty() ? nullptr : std::make_shared<storage::MembersLink>()) {}

  ClusterConfig cfg_;
  // Every node ever a member (never shrinks: views and calls hold their pointers).
  std::vector<std::unique_ptr<Node>> all_nodes_;  // guarded by apply_mu_
  std::mutex apply_mu_;                           // one membership change at a time
  mutable std::mutex view_mu_;
  std::shared_ptr<const ClusterView> view_;
  std::unique_ptr<MembershipWatch> watch_;  // etcd membership; null for a static list
  // Reads of the set for gets a node told it moved (catch_up); with etcd only. Set
  // before the first get, stopped first by the destructor and freed last.
  static constexpr auto kCatchUpSpacing = std::chrono::milliseconds(200);
  // After a read of the set failed, calls go on with the set they have for this long
  // rather than wait for the next read (etcd out of reach: calls need the nodes only).
  static constexpr auto kCatchUpBackoff = std::chrono::seconds(1);
  std::unique_ptr<MemberCatchUp> catch_up_;
  // The set's revision, which requests name, and what nodes answer of theirs
  // (members_link.hpp); with etcd only, shared by every node's client.
  std::shared_ptr<storage::MembersLink> set_link_;
  NodeLinks links_{cfg_, backend_, [this] { return view()->now->nodes; }, set_link_};

  std::shared_ptr<const ClusterView> view() const {
    std::lock_guard lock(view_mu_);
    return view_;
  }

  // The node of `address`, made on first sight (apply_mu_ held).
  Node& node_locked(const std::string& address);

  // A new view for `members`: the ring over them now, the previous placements kept
  // for reads of chunks not yet copied to their new owners.
  void set_view_locked(const std::vector<std::string>& members);

  // A membership change from etcd (on the watch's thread): new nodes are connected
  // before the view that places chunks on them is used, nodes that left are let go.
  void apply(const std::vector<std::string>& members);

  // Who to ask for a chunk first: its owners now, best first (attempt() adds, when
  // they are exhausted, the owners under the previous placements that are still
  // members: where a chunk not yet copied after a membership change still is).
  void start_order(GetOp& op, std::string key, uint64_t bytes);

  // Replicas ordered best first: nodes not marked down before those that are; then by
  // expected time for `bytes`; ties keep ring order (primary first).
  std::vector<Node*> rank(std::vector<Node*> replicas, uint64_t bytes);

  // Share of the time left for one attempt when `left` replicas remain to try.
  Deadline attempt_deadline(Deadline deadline, size_t left) const;

  void finish(const std::shared_ptr<GetOp>& op, Result<size_t> r);

  void attempt(std::shared_ptr<GetOp> op);

  static Status nowhere(const GetOp& op);

  // A get that found its chunk nowhere may have asked from a member set older than
  // the nodes': the set moved since it began (asked again under the new one), or a
  // node said its set is newer than this client's (members_link.hpp: the watch is
  // behind; the set is read from etcd, and the get asked again under it if it
  // moved). Once per get. False: the get ends here.
  bool catch_up(const std::shared_ptr<GetOp>& op);

  // The get from the start, under the member set now.
  void ask_again(const std::shared_ptr<GetOp>& op);

  // A node without a connection was said to be down once, where that was found
  // (NodeLinks' "node X is down", the start's "N of M nodes up"); each request that
  // passes it over does not say so again. The caller's message names the node.
  static Status not_connected();

  void note_failure(GetOp& op, const Node& n, const Status& s);

  // Runs on the node client's receiver thread, which must never hold the last
  // reference to that client (so the lambda above keeps only its address).
  void on_attempt(std::shared_ptr<GetOp> op, Node& n, storage::Client* c, Clock::time_point t0,
                  Deadline until, Result<size_t> r);

  Status put_one(Node& n, const std::string& context, uint32_t chunk, uint32_t level,
                 std::span<const std::byte> bytes, std::span<const storage::ObjectPart> parts, uint64_t version,
                 Deadline deadline, const CancelToken& cancel);

  template <typename T>
  struct Answers {
    Status status;
    std::vector<T> values;  // of the nodes that answered ok (not_found left out)
    size_t asked = 0, failed = 0;
    std::string errors;  // "node: error; ..." of those that failed
    Status first;        // the first failure
  };

  // Asks every node in parallel. `tolerant`: each node gets half the time left (a
  // stalled node cannot eat the deadline) and up to R-1 nodes may fail; otherwise
  // every node must answer (not_found counts as an answer). A member set behind the
  // nodes' (one of them said so, or the set moved during the call) is read again, and
  // the members it lacked are asked too (docs/protocol.md, "Member sets"): a remove
  // reaches a node that joined, a stat or a listing names what moved there.
  template <typename T, typename F>
  Answers<T> ask_all(Deadline deadline, const CancelToken& cancel, bool tolerant, F&& fn);

  template <typename T, typename F>
  void ask_nodes(const std::vector<Node*>& nodes, Deadline each, Deadline deadline, bool tolerant, F& fn,
                 Answers<T>& out);

  // The view to ask anew after a call made under `v`: the one now when the set moved
  // since, after a read of the set from etcd when a node said its own is newer than
  // this client's (waited for within the deadline); null when `v` is still current.
  // Errors: the read's, or timed_out / cancelled when it did not end in time.
  Result<std::shared_ptr<const ClusterView>> newer_view(const std::shared_ptr<const ClusterView>& v,
                                                        Deadline deadline, const CancelToken& cancel);
};

}  // namespace kvstream::cluster

// The replicated client: one storage::Client per node, chunks placed on R nodes by the
// hash ring, reads from the replica estimated fastest with failover within the
// deadline (include/kvstream/cluster.hpp, docs/storage-backends.md).
#include <algorithm>
#include <future>
#include <set>

#include <fmt/ranges.h>

#include "core/log.hpp"
#include "kvstream/cluster.hpp"
#include "storage/cluster/cluster_view.hpp"
#include "storage/cluster/get_op.hpp"
#include "storage/cluster/member_catch_up.hpp"
#include "storage/cluster/membership_watch.hpp"
#include "storage/cluster/node_links.hpp"
#include "storage/cluster/replica_merge.hpp"
#include "storage/cluster/write_outcome.hpp"
#include "storage/members_link.hpp"
#include "storage/protocol.hpp"

namespace kvstream::cluster {

using namespace std::chrono_literals;
using storage::ChunkStat;
using storage::GetCallback;
using transport::CancelToken;
using transport::Clock;
using transport::Deadline;
using transport::MemoryRegion;

namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

using Node = ClusterNode;

class ReplicatedClient final : public storage::Client {
 public:
  ~ReplicatedClient() override {
    // The gets waiting on a read of the member set end (cancelled); one that misses
    // from here on ends not_found. The object stays until no get can reach it.
    if (catch_up_) catch_up_->stop();
    links_.stop();   // ends the connects in progress and the background reconnects
    watch_.reset();  // no membership change from here on
    links_.close(all_nodes_);
  }

  static Result<std::unique_ptr<storage::Client>> create(ClusterConfig cfg, Deadline deadline,
                                                         const CancelToken& cancel) {
    KVS_RETURN_IF_ERROR(check_cluster_config(cfg));
    std::unique_ptr<EtcdClient> etcd;
    if (!cfg.etcd.endpoints.empty()) {
      KVS_ASSIGN_OR_RETURN(EtcdClient e, EtcdClient::create(cfg.etcd));
      etcd = std::make_unique<EtcdClient>(std::move(e));
    }
    KVS_ASSIGN_OR_RETURN(auto backend, transport::create_backend(cfg.backend));
    auto c = std::unique_ptr<ReplicatedClient>(new ReplicatedClient(cfg, std::move(backend)));
    {
      // Held until the first view is in place: a change the watch reports meanwhile
      // waits for it (and is then applied against it).
      std::lock_guard lock(c->apply_mu_);
      if (etcd) {
        // The members now; later changes arrive on the watch's thread.
        KVS_ASSIGN_OR_RETURN(c->watch_, MembershipWatch::start(
                                            std::move(*etcd),
                                            [p = c.get()](const MemberSet& m) { p->apply(m.nodes); },
                                            deadline, cancel,
                                            [link = c->set_link_](int64_t r) { link->set_revision(r); }));
        cfg.nodes = c->watch_->members().nodes;
        c->catch_up_ = std::make_unique<MemberCatchUp>(
            [w = c->watch_.get()](Deadline d, const CancelToken& t) { return w->catch_up(d, t); },
            [w = c->watch_.get()] { return w->revision(); },
            // each endpoint in turn may take its request timeout (a frozen member)
            cfg.etcd.request_timeout * std::max<size_t>(1, cfg.etcd.endpoints.size()), kCatchUpSpacing);
        // A node that says its set is newer than the one a request named: the set is
        // read again in the background (reads shared and spaced by MemberCatchUp), so
        // the calls after it are placed under the newer one.
        c->set_link_->on_newer = [p = c.get()](int64_t told) { p->catch_up_->nudge(told); };
        if (cfg.nodes.empty())
          return make_status(StatusCode::unavailable,
                             "cluster: no storage node is registered in etcd under '{}nodes/'", cfg.etcd.prefix);
      }
      c->set_view_locked(cfg.nodes);
      // Named in requests once the view reflects it (a request may carry an older
      // revision than its view's, never a newer one).
      if (c->watch_) c->set_link_->set_revision(c->watch_->revision());
    }
    const auto first = c->view();
    // Connect to every node in parallel, each bounded by connect_timeout.
    std::vector<std::future<Status>> pending;
    for (Node* n : first->now->nodes)
      pending.push_back(std::async(std::launch::async, [p = c.get(), n, deadline, cancel] {
        return p->links_.connect(*n, std::min(deadline, Clock::now() + p->cfg_.connect_timeout), cancel);
      }));
    size_t up = 0;
    std::string errors;
    Status refused;
    for (size_t i = 0; i < pending.size(); ++i) {
      Status s = pending[i].get();
      if (s.ok()) {
        ++up;
        continue;
      }
      errors += fmt::format("{}{}: {}", errors.empty() ? "" : "; ", first->now->nodes[i]->address, s.to_string());
      if (s.code() == StatusCode::permission_denied && refused.ok()) refused = s;
    }
    if (cancel.cancelled()) return make_status(StatusCode::cancelled, "cluster connect cancelled");
    if (!refused.ok()) return refused;
    if (up == 0) return make_status(StatusCode::unavailable, "cluster: no storage node answered ({})", errors);
    if (!errors.empty())
      KVS_LOG_WARN("cluster: {} of {} nodes up; retrying the others in the background: {}", up, pending.size(),
                   errors);
    c->links_.start_maintenance();
    return std::unique_ptr<storage::Client>(std::move(c));
  }

  // Every node's client is on the one backend, so a region registered here serves
  // gets from any replica as it is.
  const transport::Capabilities* capabilities() const override { return &backend_->capabilities(); }

  Result<MemoryRegion> register_memory(void* data, size_t size) override {
    return register_memory(data, size, transport::MemoryType::host);
  }
  Result<MemoryRegion> register_memory(void* data, size_t size, transport::MemoryType type) override {
    return backend_->register_memory(data, size, type);
  }

  Status put(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
             Deadline deadline, const CancelToken& cancel) override {
    return put_parts(context, chunk, level, bytes, {}, 0, deadline, cancel);
  }

  Status put_versioned(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                       uint64_t version, Deadline deadline, const CancelToken& cancel) override {
    return put_parts(context, chunk, level, bytes, {}, version, deadline, cancel);
  }

  // Every replica gets the bytes, the parts and one write version.
  Status put_parts(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                   std::span<const storage::ObjectPart> parts, uint64_t version, Deadline deadline,
                   const CancelToken& cancel) override {
    KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
    KVS_RETURN_IF_ERROR(storage::validate_parts(parts, bytes.size()));
    const auto v = view();
    const auto replicas = v->now->replicas(HashRing::chunk_key(context, chunk), v->replication);
    // One write version for every replica: concurrent writers of this object reach
    // the replicas in different orders, and each replica keeps the newest version,
    // so they agree.
    if (version == 0) version = storage::next_write_version();
    auto put_all = [&](const std::vector<Node*>& nodes) {
      // In parallel (the first on this thread); all answer by the deadline.
      std::vector<std::future<Status>> others;
      for (size_t i = 1; i < nodes.size(); ++i)
        others.push_back(std::async(std::launch::async, [&, n = nodes[i]] {
          return put_one(*n, context, chunk, level, bytes, parts, version, deadline, cancel);
        }));
      std::vector<OwnerAnswer> answers;
      if (!nodes.empty())
        answers.push_back({nodes[0]->address, put_one(*nodes[0], context, chunk, level, bytes, parts, version,
                                                      deadline, cancel)});
      for (size_t i = 1; i < nodes.size(); ++i) answers.push_back({nodes[i]->address, others[i - 1].get()});
      return answers;
    };
    auto answers = put_all(replicas);
    // A replica said its member set is newer than this client's (the client's watch is
    // behind), or the set moved meanwhile: the chunk may have owners it did not ask.
    // They are sent the write too, and the write is judged by the owners under the
    // newer set, so a reader whose set is current reads it once the put returns.
    auto later = newer_view(v, deadline, cancel);
    if (!later.ok() || !*later) return write_outcome(answers, v->write_quorum, context, chunk, level);
    const auto owners = (*later)->now->replicas(HashRing::chunk_key(context, chunk), (*later)->replication);
    std::vector<Node*> unasked;
    for (Node* n : owners)
      if (std::find(replicas.begin(), replicas.end(), n) == replicas.end()) unasked.push_back(n);
    auto more = put_all(unasked);
    std::vector<OwnerAnswer> judged;
    for (Node* n : owners) {
      const auto has = [&](const OwnerAnswer& a) { return a.address == n->address; };
      if (auto it = std::find_if(answers.begin(), answers.end(), has); it != answers.end()) {
        judged.push_back(*it);
      } else if (auto m = std::find_if(more.begin(), more.end(), has); m != more.end()) {
        // already_exists there: it holds this write (a copy made since) or a newer one.
        if (m->status.code() == StatusCode::already_exists) m->status = {};
        judged.push_back(*m);
      }
    }
    return write_outcome(judged, (*later)->write_quorum, context, chunk, level);
  }

  void get_async(const std::string& context, uint32_t chunk, uint32_t level, MemoryRegion dest, size_t offset,
                 size_t capacity, Deadline deadline, const CancelToken& cancel, GetCallback done) override {
    if (Status s = storage::validate_id(context, storage::kMaxContextBytes, "context id"); !s.ok()) return done(s);
    if (capacity > 0 && (!dest.valid() || dest.span(offset, capacity).size() != capacity))
      return done(make_status(StatusCode::invalid_argument, "destination [{}, {}) is outside its registered region",
                              offset, offset + capacity));
    auto op = std::make_shared<GetOp>();
    op->context = context, op->chunk = chunk, op->level = level;
    op->dest = std::move(dest), op->offset = offset, op->capacity = capacity;
    op->deadline = deadline, op->cancel = cancel, op->done = std::move(done);
    start_order(*op, HashRing::chunk_key(context, chunk), capacity);
    attempt(std::move(op));
  }

  // As get_async: the replica expected fastest for `length` bytes, then the others.
  void get_range_async(const std::string& context, uint32_t chunk, uint32_t level, uint64_t offset, uint64_t length,
                       MemoryRegion dest, size_t dest_offset, Deadline deadline, const CancelToken& cancel,
                       GetCallback done) override {
    if (Status s = storage::validate_id(context, storage::kMaxContextBytes, "context id"); !s.ok()) return done(s);
    if (length == 0) return done(make_status(StatusCode::invalid_argument, "a range of 0 bytes"));
    if (!dest.valid() || dest.span(dest_offset, length).size() != length)
      return done(make_status(StatusCode::invalid_argument, "destination [{}, {}) is outside its registered region",
                              dest_offset, dest_offset + length));
    auto op = std::make_shared<GetOp>();
    op->context = context, op->chunk = chunk, op->level = level;
    op->dest = std::move(dest), op->offset = dest_offset, op->capacity = size_t(length);
    op->range = true, op->range_offset = offset;
    op->deadline = deadline, op->cancel = cancel, op->done = std::move(done);
    start_order(*op, HashRing::chunk_key(context, chunk), length);
    attempt(std::move(op));
  }

  Result<std::vector<ChunkStat>> stat(const std::string& context, Deadline deadline,
                                      const CancelToken& cancel) override {
    KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
    auto answers = ask_all<std::vector<ChunkStat>>(
        deadline, cancel, true,
        [&](storage::Client& c, Deadline d) { return c.stat(context, d, cancel); });
    KVS_RETURN_IF_ERROR(answers.status);
    auto merged = merge_stats(context, std::move(answers.values));
    if (merged.empty()) return make_status(StatusCode::not_found, "no context '{}'", context);
    return merged;
  }

  Status remove(const std::string& context, Deadline deadline, const CancelToken& cancel) override {
    // One version for every node: each remembers the same remove.
    return remove_up_to(context, storage::next_write_version(), deadline, cancel);
  }

  // Every member is asked, as a remove must reach every copy (past owners' too); each
  // remembers it, whether it held the context or not.
  Status remove_up_to(const std::string& context, uint64_t version, Deadline deadline,
                      const CancelToken& cancel) override {
    KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
    if (version == 0) return make_status(StatusCode::invalid_argument, "remove_up_to: version 0 names no write");
    auto answers = ask_all<bool>(deadline, cancel, false, [&](storage::Client& c, Deadline d) -> Result<bool> {
      Status s = c.remove_up_to(context, version, d, cancel);
      // A node from before versioned removes deletes all, as it did.
      if (s.code() == StatusCode::unsupported) s = c.remove(context, d, cancel);
      KVS_RETURN_IF_ERROR(s);
      return true;
    });
    KVS_RETURN_IF_ERROR(answers.status);
    if (answers.values.empty()) return make_status(StatusCode::not_found, "no context '{}'", context);
    return {};
  }

  Result<std::vector<std::string>> list(Deadline deadline, const CancelToken& cancel) override {
    auto answers = ask_all<std::vector<std::string>>(
        deadline, cancel, true, [&](storage::Client& c, Deadline d) { return c.list(d, cancel); });
    KVS_RETURN_IF_ERROR(answers.status);
    std::set<std::string> all;
    for (auto& v : answers.values) all.insert(v.begin(), v.end());
    return std::vector<std::string>(all.begin(), all.end());
  }

  // Every node is told: one message each, and a node that does not hold a context
  // passes it over, so copies on past owners are marked too.
  Status touch(std::span<const storage::ContextTouch> contexts, uint64_t stamp, Deadline deadline,
               const CancelToken& cancel) override {
    if (stamp == 0) stamp = storage::next_write_version();
    auto answers = ask_all<bool>(deadline, cancel, true, [&](storage::Client& c, Deadline d) -> Result<bool> {
      KVS_RETURN_IF_ERROR(c.touch(contexts, stamp, d, cancel));
      return true;
    });
    return answers.status;
  }

  // Per context: the larger size and the newest marks of any replica, the union of
  // their chunks.
  Result<std::vector<storage::ContextUsage>> usage(const std::string& prefix, Deadline deadline,
                                                   const CancelToken& cancel) override {
    auto answers = ask_all<std::vector<storage::ContextUsage>>(
        deadline, cancel, true, [&](storage::Client& c, Deadline d) { return c.usage(prefix, d, cancel); });
    KVS_RETURN_IF_ERROR(answers.status);
    return merge_usage(std::move(answers.values));
  }

 private:
  ReplicatedClient(ClusterConfig cfg, std::shared_ptr<transport::Backend> backend)
      : cfg_(std::move(cfg)),
        backend_(std::move(backend)),
        set_link_(cfg_.etcd.endpoints.empty() ? nullptr : std::make_shared<storage::MembersLink>()) {}

  ClusterConfig cfg_;
  // Shared by every node's client: one endpoint or worker, and one registration of
  // each caller's buffer, however many nodes there are.
  std::shared_ptr<transport::Backend> backend_;
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
  Node& node_locked(const std::string& address) {
    for (auto& n : all_nodes_)
      if (n->address == address) return *n;
    return *all_nodes_.emplace_back(std::make_unique<Node>(address, cfg_.ewma_weight));
  }

  // A new view for `members`: the ring over them now, the previous placements kept
  // for reads of chunks not yet copied to their new owners.
  void set_view_locked(const std::vector<std::string>& members) {
    auto placement = std::make_shared<Placement>(cfg_.virtual_nodes);
    for (const auto& a : members)
      if (placement->ring.add(a).ok()) placement->nodes.push_back(&node_locked(a));
    auto v = ClusterView::after(view().get(), std::move(placement), cfg_.replication, cfg_.write_quorum);
    std::lock_guard lock(view_mu_);
    view_ = std::move(v);
  }

  // A membership change from etcd (on the watch's thread): new nodes are connected
  // before the view that places chunks on them is used, nodes that left are let go.
  void apply(const std::vector<std::string>& members) {
    if (members.empty()) {
      KVS_LOG_WARN("cluster: etcd lists no storage node; keeping the last member set until one registers");
      return;
    }
    std::lock_guard lock(apply_mu_);
    const auto old = view();
    if (!old) return;  // create() failed before its first view; the client is going away
    std::vector<std::string> joined, left;
    for (const auto& a : members)
      if (std::none_of(old->now->nodes.begin(), old->now->nodes.end(), [&](Node* n) { return n->address == a; }))
        joined.push_back(a);
    for (Node* n : old->now->nodes)
      if (!std::binary_search(members.begin(), members.end(), n->address)) left.push_back(n->address);
    std::vector<std::future<Status>> connects;
    for (const auto& a : joined) {
      Node* n = &node_locked(a);
      if (links_.client_of(*n)) continue;
      connects.push_back(std::async(std::launch::async, [this, n] { return links_.reconnect(*n); }));
    }
    for (auto& f : connects) (void)f.get();  // a node that did not answer is retried in the background
    set_view_locked(members);
    for (const auto& a : left) links_.let_go(node_locked(a));
    KVS_LOG_INFO("cluster: membership now {} nodes ({} joined: {}; {} left: {})", members.size(), joined.size(),
                 fmt::join(joined, ", "), left.size(), fmt::join(left, ", "));
  }

  // Who to ask for a chunk first: its owners now, best first (attempt() adds, when
  // they are exhausted, the owners under the previous placements that are still
  // members: where a chunk not yet copied after a membership change still is).
  void start_order(GetOp& op, std::string key, uint64_t bytes) {
    op.view = view();
    op.key = std::move(key);
    op.order = rank(op.view->now->replicas(op.key, op.view->replication), bytes);
  }

  // Replicas ordered best first: nodes not marked down before those that are; then by
  // expected time for `bytes`; ties keep ring order (primary first).
  std::vector<Node*> rank(std::vector<Node*> replicas, uint64_t bytes) {
    const auto now = Clock::now();
    std::vector<std::tuple<bool, double, size_t, Node*>> keyed;
    for (size_t i = 0; i < replicas.size(); ++i) {
      Node& n = *replicas[i];
      const bool connected = links_.client_of(n) != nullptr;
      keyed.emplace_back(!connected || n.health.down(now), n.health.expected_seconds(bytes), i, replicas[i]);
    }
    std::sort(keyed.begin(), keyed.end());
    std::vector<Node*> out;
    for (auto& k : keyed) out.push_back(std::get<3>(k));
    return out;
  }

  // Share of the time left for one attempt when `left` replicas remain to try.
  Deadline attempt_deadline(Deadline deadline, size_t left) const {
    const auto now = Clock::now();
    if (now >= deadline || left <= 1) return deadline;
    const auto remaining = deadline - now;
    auto share = remaining / left;
    share = std::max<Clock::duration>(share, cfg_.min_attempt);
    return now + std::min<Clock::duration>(share, remaining);
  }

  void finish(const std::shared_ptr<GetOp>& op, Result<size_t> r) {
    auto done = std::move(op->done);
    op->dest = {};
    done(std::move(r));
  }

  void attempt(std::shared_ptr<GetOp> op) {
    while (true) {
      if (op->cancel.cancelled()) return finish(op, make_status(StatusCode::cancelled, "get cancelled"));
      if (links_.closing()) return finish(op, make_status(StatusCode::cancelled, "client closed"));
      if (Clock::now() >= op->deadline)
        return finish(op, make_status(StatusCode::timed_out, "chunk {} level {} of '{}': deadline passed{}{}",
                                      op->chunk, op->level, op->context, op->errors.empty() ? "" : " after ",
                                      op->errors));
      if (op->next >= op->order.size() && !op->asked_past) {
        op->asked_past = true;
        op->view->append_past_owners(op->key, op->order);
        continue;
      }
      if (op->next >= op->order.size()) {
        if (op->only_not_found) {
          if (catch_up(op)) return;
          return finish(op, nowhere(*op));
        }
        return finish(op, Status(op->last_error.code(),
                                 fmt::format("chunk {} level {} of '{}': every replica failed: {}", op->chunk,
                                             op->level, op->context, op->errors)));
      }
      // Replicas left that can be asked (connected): the time is shared among them.
      size_t left = 0;
      for (size_t i = op->next; i < op->order.size(); ++i) left += links_.client_of(*op->order[i]) != nullptr;
      Node& n = *op->order[op->next++];
      auto c = links_.client_of(n);
      if (!c) {
        note_failure(*op, n, not_connected());
        continue;
      }
      const Deadline until = attempt_deadline(op->deadline, left);
      const auto t0 = Clock::now();
      n.health.started(op->capacity);
      auto then = [this, op, np = &n, cp = c.get(), t0, until](Result<size_t> r) mutable {
        on_attempt(std::move(op), *np, cp, t0, until, std::move(r));
      };
      if (op->range)
        c->get_range_async(op->context, op->chunk, op->level, op->range_offset, op->capacity, op->dest,
                           op->offset, until, op->cancel, std::move(then));
      else
        c->get_async(op->context, op->chunk, op->level, op->dest, op->offset, op->capacity, until,
                     op->cancel, std::move(then));
      return;
    }
  }

  static Status nowhere(const GetOp& op) {
    return make_status(StatusCode::not_found, "chunk {} level {} of '{}' is on none of its {} replicas", op.chunk,
                       op.level, op.context, op.order.size());
  }

  // A get that found its chunk nowhere may have asked from a member set older than
  // the nodes': the set moved since it began (asked again under the new one), or a
  // node said its set is newer than this client's (members_link.hpp: the watch is
  // behind; the set is read from etcd, and the get asked again under it if it
  // moved). Once per get. False: the get ends here.
  bool catch_up(const std::shared_ptr<GetOp>& op) {
    if (!catch_up_ || op->asked_again) return false;
    if (view() != op->view) {
      ask_again(op);
      return true;
    }
    op->asked_again = true;
    if (!catch_up_->recent_failure(kCatchUpBackoff).ok()) return false;  // etcd out of reach: not_found now
    return catch_up_->request(set_link_->newer_than_told(), [this, op](const Status& read) {
      if (read.code() == StatusCode::cancelled) return finish(op, read);
      if (!read.ok() || view() == op->view || Clock::now() >= op->deadline) return finish(op, nowhere(*op));
      ask_again(op);
    });
  }

  // The get from the start, under the member set now.
  void ask_again(const std::shared_ptr<GetOp>& op) {
    op->asked_again = true;
    op->view = view();
    op->order = rank(op->view->now->replicas(op->key, op->view->replication), op->capacity);
    op->next = 0;
    op->asked_past = false;
    attempt(op);
  }

  // A node without a connection was said to be down once, where that was found
  // (NodeLinks' "node X is down", the start's "N of M nodes up"); each request that
  // passes it over does not say so again. The caller's message names the node.
  static Status not_connected() {
    return detail::repeated_status(StatusCode::unavailable, "not connected (reconnecting in the background)");
  }

  void note_failure(GetOp& op, const Node& n, const Status& s) {
    op.errors += fmt::format("{}{}: {}", op.errors.empty() ? "" : "; ", n.address, s.to_string());
    if (s.code() != StatusCode::not_found) {
      op.only_not_found = false;
      op.last_error = s;
    }
  }

  // Runs on the node client's receiver thread, which must never hold the last
  // reference to that client (so the lambda above keeps only its address).
  void on_attempt(std::shared_ptr<GetOp> op, Node& n, storage::Client* c, Clock::time_point t0,
                  Deadline until, Result<size_t> r) {
    const auto now = Clock::now();
    if (r.ok()) {
      n.health.succeeded(op->capacity, seconds_between(t0, now), *r);
      return finish(op, std::move(r));
    }
    const Status s = r.status();
    const bool stalled = s.code() == StatusCode::timed_out && until < op->deadline;
    n.health.failed(op->capacity, stalled ? seconds_between(t0, now) : 0);
    if (final_error(s.code()) || (s.code() == StatusCode::cancelled && op->cancel.cancelled()) ||
        (s.code() == StatusCode::timed_out && !stalled)) {
      return finish(op, s);
    }
    if (stalled) {
      n.health.mark_down(now + cfg_.retry_down_after);
      KVS_LOG_WARN("cluster: node {} stalled past its share of the deadline; trying another replica", n.address);
    } else if (s.code() == StatusCode::unavailable || s.code() == StatusCode::corrupt_data) {
      links_.retire(n, c, s);
    }
    note_failure(*op, n, s);
    attempt(std::move(op));
  }

  Status put_one(Node& n, const std::string& context, uint32_t chunk, uint32_t level,
                 std::span<const std::byte> bytes, std::span<const storage::ObjectPart> parts, uint64_t version,
                 Deadline deadline, const CancelToken& cancel) {
    auto c = links_.client_of(n);
    if (!c) return not_connected();
    const auto t0 = Clock::now();
    n.health.started(0);
    Status s = c->put_parts(context, chunk, level, bytes, parts, version, deadline, cancel);
    // The node answered: it is well (resource_exhausted, no_space: no room for this put there).
    if (s.ok() || s.code() == StatusCode::already_exists || s.code() == StatusCode::resource_exhausted ||
        s.code() == StatusCode::no_space) {
      n.health.succeeded(0, seconds_between(t0, Clock::now()), 0);
    } else {
      n.health.failed(0);
      if (s.code() == StatusCode::unavailable || s.code() == StatusCode::corrupt_data) links_.retire(n, c.get(), s);
    }
    return s;
  }

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
  Answers<T> ask_all(Deadline deadline, const CancelToken& cancel, bool tolerant, F&& fn) {
    Answers<T> out;
    if (cancel.cancelled()) return {make_status(StatusCode::cancelled, "cancelled"), {}};
    const auto v = view();
    const Deadline each = tolerant && v->now->nodes.size() > 1 ? attempt_deadline(deadline, 2) : deadline;
    ask_nodes(v->now->nodes, each, deadline, tolerant, fn, out);
    auto later = newer_view(v, deadline, cancel);
    if (later.ok() && *later) {
      std::vector<Node*> lacked;
      for (Node* n : (*later)->now->nodes)
        if (std::find(v->now->nodes.begin(), v->now->nodes.end(), n) == v->now->nodes.end()) lacked.push_back(n);
      ask_nodes(lacked, tolerant ? attempt_deadline(deadline, 2) : deadline, deadline, tolerant, fn, out);
    }
    if (cancel.cancelled()) return {make_status(StatusCode::cancelled, "cancelled"), {}};
    const size_t allowed = tolerant ? v->replication - 1 : 0;
    if (out.failed > allowed) {
      const StatusCode code = Clock::now() >= deadline ? StatusCode::timed_out
                              : final_error(out.first.code()) || out.first.code() == StatusCode::permission_denied
                                  ? out.first.code()
                                  : StatusCode::unavailable;
      out.status = Status(code, fmt::format("{} of {} storage nodes failed ({} tolerated with replication {}): {}",
                                            out.failed, out.asked, allowed, v->replication, out.errors));
    } else if (!later.ok() && !tolerant) {
      // Every node it knows answered, but a newer set may hold one it does not.
      out.status = later.status();
    }
    return out;
  }

  template <typename T, typename F>
  void ask_nodes(const std::vector<Node*>& nodes, Deadline each, Deadline deadline, bool tolerant, F& fn,
                 Answers<T>& out) {
    const auto now = Clock::now();
    std::vector<std::future<Result<T>>> futures;
    for (Node* n : nodes) {
      futures.push_back(std::async(std::launch::async, [&, n]() -> Result<T> {
        auto c = links_.client_of(*n);
        if (!c) return not_connected();
        if (tolerant && n->health.down(now))
          return detail::repeated_status(StatusCode::unavailable, "marked down after a stall");
        const auto t0 = Clock::now();
        Result<T> r = fn(*c, each);
        if (r.ok() || r.status().code() == StatusCode::not_found) {
          n->health.succeeded(0, seconds_between(t0, Clock::now()), 0);
        } else if (r.status().code() == StatusCode::timed_out && each < deadline) {
          n->health.failed(0, seconds_between(t0, Clock::now()));
          n->health.mark_down(Clock::now() + cfg_.retry_down_after);
        } else if (r.status().code() == StatusCode::unavailable || r.status().code() == StatusCode::corrupt_data) {
          links_.retire(*n, c.get(), r.status());
        }
        return r;
      }));
    }
    out.asked += nodes.size();
    for (size_t i = 0; i < futures.size(); ++i) {
      Result<T> r = futures[i].get();
      if (r.ok()) {
        out.values.push_back(std::move(r).value());
      } else if (r.status().code() != StatusCode::not_found) {
        ++out.failed;
        if (out.first.ok()) out.first = r.status();
        out.errors +=
            fmt::format("{}{}: {}", out.errors.empty() ? "" : "; ", nodes[i]->address, r.status().to_string());
      }
    }
  }

  // The view to ask anew after a call made under `v`: the one now when the set moved
  // since, after a read of the set from etcd when a node said its own is newer than
  // this client's (waited for within the deadline); null when `v` is still current.
  // Errors: the read's, or timed_out / cancelled when it did not end in time.
  Result<std::shared_ptr<const ClusterView>> newer_view(const std::shared_ptr<const ClusterView>& v,
                                                        Deadline deadline, const CancelToken& cancel) {
    if (!catch_up_) return std::shared_ptr<const ClusterView>();
    const int64_t told = set_link_->newer_than_told();
    const bool behind = told > set_link_->revision() && view() == v;  // lock-free when no node said so
    if (behind) {
      if (Status failed = catch_up_->recent_failure(kCatchUpBackoff); !failed.ok())
        return Status(StatusCode::unavailable,
                      fmt::format("a node's member set is newer than this client's, and etcd did not answer its "
                                  "last read of it: {}",
                                  failed.to_string()));
      auto read = std::make_shared<std::promise<Status>>();
      auto done = read->get_future();
      if (catch_up_->request(told, [read](const Status& s) { read->set_value(s); })) {
        while (done.wait_for(20ms) != std::future_status::ready) {
          if (cancel.cancelled()) return make_status(StatusCode::cancelled, "cancelled reading the member set");
          if (Clock::now() >= deadline)
            return make_status(StatusCode::timed_out,
                               "a node's member set is newer than this client's, and reading it from etcd did not "
                               "end by the deadline");
        }
        if (Status s = done.get(); !s.ok())
          return Status(s.code() == StatusCode::cancelled ? s.code() : StatusCode::unavailable,
                        fmt::format("a node's member set is newer than this client's, and reading it from etcd "
                                    "failed: {}",
                                    s.to_string()));
      }
    }
    auto now = view();
    return now == v ? std::shared_ptr<const ClusterView>() : now;
  }
};

}  // namespace

Result<std::unique_ptr<storage::Client>> connect(const ClusterConfig& config, Deadline deadline,
                                                 const CancelToken& cancel) {
  return ReplicatedClient::create(config, deadline, cancel);
}

}  // namespace kvstream::cluster

// The replicated client (replicated_client.hpp): connecting to the nodes, following
// the member set, writes to every replica, and the calls that ask every node.
#include "storage/cluster/replicated_client.hpp"

#include <algorithm>
#include <future>
#include <set>

#include <fmt/ranges.h>

#include "core/log.hpp"
#include "storage/cluster/replica_merge.hpp"
#include "storage/cluster/write_outcome.hpp"
#include "storage/protocol.hpp"

namespace kvstream::cluster {

using namespace std::chrono_literals;
using storage::ChunkStat;
using transport::CancelToken;
using transport::Clock;
using transport::Deadline;

ReplicatedClient::~ReplicatedClient() {
  // The gets waiting on a read of the member set end (cancelled); one that misses
  // from here on ends not_found. The object stays until no get can reach it.
  if (catch_up_) catch_up_->stop();
  links_.stop();   // ends the connects in progress and the background reconnects
  watch_.reset();  // no membership change from here on
  links_.close(all_nodes_);
}

Result<std::unique_ptr<storage::Client>> ReplicatedClient::create(ClusterConfig cfg, Deadline deadline,
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

template <typename T, typename F>
ReplicatedClient::Answers<T> ReplicatedClient::ask_all(Deadline deadline, const CancelToken& cancel, bool tolerant,
                                                       F&& fn) {
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
void ReplicatedClient::ask_nodes(const std::vector<Node*>& nodes, Deadline each, Deadline deadline, bool tolerant,
                                 F& fn, Answers<T>& out) {
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

Status ReplicatedClient::put_parts(const std::string& context, uint32_t chunk, uint32_t level,
                                   std::span<const std::byte> bytes, std::span<const storage::ObjectPart> parts,
                                   uint64_t version, Deadline deadline, const CancelToken& cancel) {
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

Result<std::vector<ChunkStat>> ReplicatedClient::stat(const std::string& context, Deadline deadline,
                                                      const CancelToken& cancel) {
  KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
  auto answers = ask_all<std::vector<ChunkStat>>(
      deadline, cancel, true,
      [&](storage::Client& c, Deadline d) { return c.stat(context, d, cancel); });
  KVS_RETURN_IF_ERROR(answers.status);
  auto merged = merge_stats(context, std::move(answers.values));
  if (merged.empty()) return make_status(StatusCode::not_found, "no context '{}'", context);
  return merged;
}

Status ReplicatedClient::remove(const std::string& context, Deadline deadline, const CancelToken& cancel) {
  return remove_up_to(context, storage::next_write_version(), deadline, cancel);
}

Status ReplicatedClient::remove_up_to(const std::string& context, uint64_t version, Deadline deadline,
                                      const CancelToken& cancel) {
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

Result<std::vector<std::string>> ReplicatedClient::list(Deadline deadline, const CancelToken& cancel) {
  auto answers = ask_all<std::vector<std::string>>(
      deadline, cancel, true, [&](storage::Client& c, Deadline d) { return c.list(d, cancel); });
  KVS_RETURN_IF_ERROR(answers.status);
  std::set<std::string> all;
  for (auto& v : answers.values) all.insert(v.begin(), v.end());
  return std::vector<std::string>(all.begin(), all.end());
}

Status ReplicatedClient::touch(std::span<const storage::ContextTouch> contexts, uint64_t stamp, Deadline deadline,
                               const CancelToken& cancel) {
  if (stamp == 0) stamp = storage::next_write_version();
  auto answers = ask_all<bool>(deadline, cancel, true, [&](storage::Client& c, Deadline d) -> Result<bool> {
    KVS_RETURN_IF_ERROR(c.touch(contexts, stamp, d, cancel));
    return true;
  });
  return answers.status;
}

Result<std::vector<storage::ContextUsage>> ReplicatedClient::usage(const std::string& prefix, Deadline deadline,
                                                                   const CancelToken& cancel) {
  auto answers = ask_all<std::vector<storage::ContextUsage>>(
      deadline, cancel, true, [&](storage::Client& c, Deadline d) { return c.usage(prefix, d, cancel); });
  KVS_RETURN_IF_ERROR(answers.status);
  return merge_usage(std::move(answers.values));
}

ClusterNode& ReplicatedClient::node_locked(const std::string& address) {
  for (auto& n : all_nodes_)
    if (n->address == address) return *n;
  return *all_nodes_.emplace_back(std::make_unique<Node>(address, cfg_.ewma_weight));
}

void ReplicatedClient::set_view_locked(const std::vector<std::string>& members) {
  auto placement = std::make_shared<Placement>(cfg_.virtual_nodes);
  for (const auto& a : members)
    if (placement->ring.add(a).ok()) placement->nodes.push_back(&node_locked(a));
  auto v = ClusterView::after(view().get(), std::move(placement), cfg_.replication, cfg_.write_quorum);
  std::lock_guard lock(view_mu_);
  view_ = std::move(v);
}

void ReplicatedClient::apply(const std::vector<std::string>& members) {
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

Status ReplicatedClient::not_connected() {
  return detail::repeated_status(StatusCode::unavailable, "not connected (reconnecting in the background)");
}

Status ReplicatedClient::put_one(Node& n, const std::string& context, uint32_t chunk, uint32_t level,
                                 std::span<const std::byte> bytes, std::span<const storage::ObjectPart> parts,
                                 uint64_t version, Deadline deadline, const CancelToken& cancel) {
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

Result<std::shared_ptr<const ClusterView>> ReplicatedClient::newer_view(const std::shared_ptr<const ClusterView>& v,
                                                                        Deadline deadline,
                                                                        const CancelToken& cancel) {
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

Result<std::unique_ptr<storage::Client>> connect(const ClusterConfig& config, Deadline deadline,
                                                 const CancelToken& cancel) {
  return ReplicatedClient::create(config, deadline, cancel);
}

}  // namespace kvstream::cluster

// The node's membership agent and its rebalance passes (rebalancer.hpp).
#include "storage/cluster/rebalancer.hpp"

#include <algorithm>
#include <optional>
#include <set>

#include <fmt/ranges.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "core/log.hpp"
#include "kvstream/cluster.hpp"
#include "storage/cluster/peer_clients.hpp"

namespace kvstream::cluster {

using namespace std::chrono_literals;
using transport::Clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// One object's delivery to one owner, as a 64-bit hash (xxh3 of the fields, each
/// followed by a 0 byte so that no two field lists read alike).
uint64_t delivery_id(const std::string& ns, const std::string& ctx, uint32_t chunk, uint32_t level,
                     const std::string& node) {
  std::string k;
  k.reserve(ns.size() + ctx.size() + node.size() + 16);
  for (const std::string* f : {&ns, &ctx, &node}) k.append(*f).push_back('\0');
  k.append(reinterpret_cast<const char*>(&chunk), sizeof chunk).append(reinterpret_cast<const char*>(&level), sizeof level);
  return XXH3_64bits(k.data(), k.size());
}

HashRing ring_of(const std::vector<std::string>& members, uint32_t vnodes) {
  HashRing ring(vnodes);
  for (const auto& a : members) (void)ring.add(a);
  return ring;
}

}  // namespace

Result<std::unique_ptr<Rebalancer>> Rebalancer::start(const RebalanceConfig& config, std::string self,
                                                      storage::ChunkStore& store, storage::MemoryBudget& budget,
                                                      std::map<std::string, std::string> secrets,
                                                      transport::BackendConfig backend) {
  if (config.replication == 0) return make_status(StatusCode::invalid_argument, "rebalance: replication must be >= 1");
  if (config.retry_first.count() <= 0 || config.retry_max < config.retry_first)
    return make_status(StatusCode::invalid_argument,
                       "rebalance: retry_first ({} ms) must be positive and retry_max ({} ms) no shorter",
                       config.retry_first.count(), config.retry_max.count());
  if (self.empty() || self.rfind("0.0.0.0:", 0) == 0 || self.rfind("[::]:", 0) == 0)
    return make_status(StatusCode::invalid_argument,
                       "rebalance: the node listens on '{}', which other nodes cannot reach: set "
                       "membership.advertise to its reachable host:port",
                       self);
  KVS_ASSIGN_OR_RETURN(EtcdClient etcd, EtcdClient::create(config.etcd));
  auto r = std::unique_ptr<Rebalancer>(
      new Rebalancer(config, std::move(self), store, budget, std::move(secrets), std::move(backend)));
  const auto deadline = Clock::now() + config.etcd.request_timeout * 2;
  // Each renewal marks the store as served by a member (member_mark.hpp): a node that
  // comes back after longer than removes are remembered drops what it held. A node
  // the others dropped while it ran fences (or drops) what it holds before it is a
  // member again, as at a restart.
  NodeRegistration::Hooks hooks;
  hooks.on_member = [&store] { (void)store.note_member(std::chrono::system_clock::now()); };
  hooks.before_rejoin = [p = r.get()](Clock::duration away) { p->before_rejoin(away); };
  KVS_ASSIGN_OR_RETURN(r->registration_, NodeRegistration::start(etcd, r->self_, deadline, std::move(hooks)));
  // Registered first, so the set read next includes this node.
  KVS_ASSIGN_OR_RETURN(r->watch_, MembershipWatch::start(
                                       std::move(etcd), [p = r.get()](const MemberSet& m) { p->on_change(m); }, deadline));
  r->catch_up_ = std::make_unique<MemberCatchUp>(
      [w = r->watch_.get()](transport::Deadline d, const transport::CancelToken& t) { return w->catch_up(d, t); },
      [w = r->watch_.get()] { return w->revision(); },
      // each endpoint in turn may take its request timeout (a frozen member)
      config.etcd.request_timeout * std::max<size_t>(1, config.etcd.endpoints.size()), kCatchUpSpacing);
  Members first = r->members_of(r->watch_->members());
  {
    std::lock_guard lock(r->mu_);  // on_write may run already (the node serves)
    r->target_ = std::move(first);
  }
  r->worker_ = std::thread([p = r.get()] { p->run(); });
  return r;
}

Rebalancer::~Rebalancer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  stop_.cancel();
  cv_.notify_all();
  if (catch_up_) catch_up_->stop();
  watch_.reset();
  if (worker_.joinable()) worker_.join();
  registration_.reset();  // leaves the membership now
}

Rebalancer::Members Rebalancer::members_of(const MemberSet& set) const {
  return {set, ring_of(set.nodes, cfg_.virtual_nodes)};
}

void Rebalancer::on_change(const MemberSet& members) {
  Members next = members_of(members);  // outside the lock: 1024 points a node
  std::lock_guard lock(mu_);
  // Out of the set, or in it under a new registration: either way it missed removes.
  for (const auto& [n, revision] : target_.set.registered)
    if (const auto it = members.registered.find(n); it == members.registered.end() || it->second != revision)
      left_since_pass_.insert(n);
  target_ = std::move(next);
  changed_locked();
}

void Rebalancer::changed_locked() {
  ++generation_;
  changed_at_ = Clock::now();
  cv_.notify_all();
}

void Rebalancer::before_rejoin(Clock::duration away) {
  const auto secs = std::chrono::ceil<std::chrono::seconds>(away);  // longer, not shorter
  auto dropped = store_.rejoin(secs);
  if (!dropped.ok())
    KVS_LOG_WARN("rebalance: node {} could not drop what it held before its cluster dropped it ({}); it stays "
                 "fenced",
                 self_, dropped.status().to_string());
  else
    KVS_LOG_INFO("rebalance: node {} rejoins after {} s out of its cluster: what it holds {} until its members "
                 "have handed it their removes",
                 self_, secs.count(), *dropped > 0 ? fmt::format("went ({} objects)", *dropped) : "is fenced");
  // A pass and a trim follow even where the watch saw no change (the set before and
  // after is the same): the trim lifts the fence once every member reports a set
  // with this node done.
  std::lock_guard lock(mu_);
  changed_locked();
}

bool Rebalancer::owned_locked(const std::string& chunk_key) const {
  if (target_.ring.size() == 0) return true;  // not started yet: nothing to say
  const auto owners = target_.ring.replicas(chunk_key, cfg_.replication);
  return std::find(owners.begin(), owners.end(), self_) != owners.end();
}

void Rebalancer::on_write(const storage::ObjectKey& key) {
  if (!cfg_.trim_surplus) return;
  const std::string chunk_key = HashRing::chunk_key(key.ctx, key.chunk);
  std::lock_guard lock(mu_);
  if (owned_locked(chunk_key)) return;
  if (strays_.size() >= kMaxStrays) strays_overflow_ = true;
  else if (strays_.emplace(key.ns, key.ctx).second && strays_.size() == 1) cv_.notify_all();
}

int64_t Rebalancer::members_revision() const { return watch_->revision(); }

void Rebalancer::heard_of_newer_members(int64_t revision) {
  catch_up_->nudge(revision);
}

void Rebalancer::report(const Members& target, bool done, const Tally& t, double seconds, bool trimmed) {
  const nlohmann::json j = {{"node", self_},
                            {"members", target.set.nodes},
                            {"members_revision", target.set.newest()},
                            {"done", done},
                            {"objects_copied", t.objects_copied},
                            {"bytes_copied", t.bytes_copied},
                            {"objects_present", t.objects_present},
                            {"objects_failed", t.objects_failed},
                            {"seconds", seconds},
                            {"trimmed", trimmed},
                            {"objects_trimmed", t.objects_trimmed},
                            {"bytes_trimmed", t.bytes_trimmed},
                            {"objects_kept", t.objects_kept},
                            {"objects_handed_over", t.objects_handed_over},
                            {"bytes_handed_over", t.bytes_handed_over},
                            {"removes_handed_on", t.removes_handed_on},
                            {"removes_complete_since_ms", removes_complete_since()}};
  // A report that does not reach etcd is replaced by the next one.
  (void)registration_->publish("migration", j.dump(), Clock::now() + cfg_.etcd.request_timeout);
}

std::map<std::string, int64_t> Rebalancer::removes_complete_since() {
  std::map<std::string, int64_t> out;
  for (const auto& [ns, secret] : secrets_)
    if (const auto since = store_.removes_complete_since(ns))
      out[ns] = std::chrono::duration_cast<std::chrono::milliseconds>(since->time_since_epoch()).count();
  return out;
}

std::map<std::string, std::chrono::system_clock::time_point> Rebalancer::horizons_of(
    const std::vector<MigrationReport>& reports) const {
  std::map<std::string, std::chrono::system_clock::time_point> out;
  for (const MigrationReport& r : reports) {
    if (r.node == self_) continue;
    for (const auto& [ns, ms] : r.removes_complete_since_ms) {
      const auto at = std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
      auto [it, fresh] = out.emplace(ns, at);
      if (!fresh) it->second = std::max(it->second, at);
    }
  }
  return out;
}

void Rebalancer::run() {
  std::unique_lock lock(mu_);
  // The set this node has rebalanced for: at start, the one it joined.
  Members settled = target_;
  uint64_t settled_generation = generation_;
  lock.unlock();
  report(settled, true, {}, 0);
  lock.lock();
  bool retry = false;  // the last pass left objects uncopied
  // Copies of chunks this node does not own under `settled` wait to be dropped: after
  // each finished pass, and at start (the node may have been away while the cluster
  // gave its chunks to others). `last` and `last_seconds` are that pass's figures,
  // which the trim's report repeats. (Without the surplus trim, the trim lifts the
  // store's fence alone.)
  bool trim_due = true;
  // The contexts the due trim looks at: every one (nullopt), or those clients with an
  // older member set wrote to since (on_write).
  std::optional<std::set<std::pair<std::string, std::string>>> scope;
  Tally last;
  double last_seconds = 0;
  // Passes that keep failing (an owner out of space until its quota is raised, a node
  // down) read and offer every object they must send: once a second that was a
  // node's disk and the new owner's network, for as long as it lasted. They back off
  // instead, and a new change wakes them. Trims waiting for the other members back
  // off alike.
  auto retry_delay = cfg_.retry_first;
  uint64_t tried_generation = settled_generation;
  while (!stopping_) {
    if (retry || trim_due) {
      // While the store is fenced (what it held is not served: the node's own
      // unavailability) the due trim looks at the members' reports every kFencePoll,
      // not after a growing delay: a look is one etcd read.
      auto delay = retry_delay;
      if (trim_due && !retry) {
        lock.unlock();
        const bool fenced = store_.fenced();
        lock.lock();
        if (fenced) delay = std::min(delay, kFencePoll);
      }
      cv_.wait_for(lock, delay, [&] { return stopping_ || generation_ != tried_generation; });
      retry_delay = generation_ != tried_generation ? cfg_.retry_first : std::min(retry_delay * 2, cfg_.retry_max);
    } else {
      retry_delay = cfg_.retry_first;
      const auto strays = [&] { return cfg_.trim_surplus && (!strays_.empty() || strays_overflow_); };
      cv_.wait(lock, [&] { return stopping_ || generation_ != settled_generation || strays(); });
      if (!stopping_ && generation_ == settled_generation) {
        // Writes of chunks this node does not own: a moment for more of them (a client
        // behind writes a context's chunks together), then a look at their contexts.
        cv_.wait_for(lock, cfg_.settle, [&] { return stopping_ || generation_ != settled_generation; });
        if (!stopping_ && generation_ == settled_generation) {
          if (strays_overflow_) scope.reset();
          else scope = std::move(strays_);
          strays_.clear(), strays_overflow_ = false;
          trim_due = true;
        }
      }
    }
    if (stopping_) break;
    if (trim_due && !retry && generation_ == settled_generation) {
      const uint64_t gen = generation_;
      const auto started = Clock::now();
      lock.unlock();
      const TrimResult t = trim(settled, gen, last, scope ? &*scope : nullptr);
      if (t == TrimResult::finished && cfg_.trim_surplus) {
        report(settled, true, last, last_seconds, true);
        KVS_LOG_INFO("rebalance of node {} for {} members: {} copies of chunks it no longer owns dropped ({} bytes) "
                     "in {:.2f} s, {} of them sent first to owners that lacked them ({} bytes), {} kept",
                     self_, settled.ring.size(), last.objects_trimmed, last.bytes_trimmed, seconds_since(started),
                     last.objects_handed_over, last.bytes_handed_over, last.objects_kept);
      }
      lock.lock();
      if (t == TrimResult::finished) trim_due = false;
      continue;  // again: after the next delay; cut: the new change is taken next
    }
    // Changes that come together (several nodes starting, a node replaced) make one pass.
    cv_.wait_for(lock, cfg_.settle, [&] { return stopping_; });
    if (stopping_) break;
    const uint64_t gen = generation_;
    const Members target = target_;
    const std::set<std::string> bounced = left_since_pass_;
    const auto changed_at = changed_at_;
    pace_start_ = Clock::now(), paced_bytes_ = 0;
    lock.unlock();
    Tally tally;
    report(target, false, tally, seconds_since(changed_at));
    const bool complete = pass(settled.ring, target.ring, bounced, tally, gen);
    const double secs = seconds_since(changed_at);
    lock.lock();
    if (!complete) {  // a newer change (or stop): the next pass starts from `settled` again
      retry = false;
      continue;
    }
    retry = tally.objects_failed > 0;
    tried_generation = gen;
    if (!retry) {
      settled = target, settled_generation = gen;
      // Handed their removes. (A change since, which may have dropped one again, keeps
      // them all for the next pass.)
      if (generation_ == gen)
        for (const auto& n : bounced) left_since_pass_.erase(n);
      trim_due = true, last = tally, last_seconds = secs, scope.reset();
      // The first look at the others' reports comes soon: their passes for the same
      // change tend to end together. Later looks back off from there.
      retry_delay = std::min<std::chrono::milliseconds>(std::max<std::chrono::milliseconds>(cfg_.settle, 50ms),
                                                        cfg_.retry_first);
    }
    lock.unlock();
    report(target, !retry, tally, secs);
    KVS_LOG_INFO("rebalance of node {} for {} members {} in {:.2f} s: {} objects ({} bytes) copied, {} already "
                 "there, {} failed, {} removes handed on{}",
                 self_, target.ring.size(), retry ? "incomplete" : "done", secs, tally.objects_copied, tally.bytes_copied,
                 tally.objects_present, tally.objects_failed, tally.removes_handed_on,
                 retry ? fmt::format("; retrying in {} s", std::chrono::duration<double>(retry_delay).count()) : "");
    lock.lock();
  }
}

bool Rebalancer::pace(uint64_t bytes, uint64_t gen) {
  std::unique_lock lock(mu_);
  paced_bytes_ += bytes;
  const auto due = cfg_.bytes_per_second == 0
                       ? Clock::now()
                       : pace_start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                           double(paced_bytes_) / double(cfg_.bytes_per_second)));
  cv_.wait_until(lock, due, [&] { return stopping_ || generation_ != gen; });
  return !stopping_ && generation_ == gen;
}

bool Rebalancer::pass(const HashRing& before, const HashRing& after, const std::set<std::string>& bounced,
                      Tally& tally, uint64_t gen) {
  if (gen != delivered_gen_) delivered_.clear(), delivered_gen_ = gen;
  const std::set<std::string> members(after.nodes().begin(), after.nodes().end());
  // Connections to the new owners, per tenant; a node that does not answer is not
  // asked again in this pass (its objects count as failed and the pass is retried).
  PeerClients peers(self_, backend_, secrets_, stop_);
  if (!hand_on_removes(peers, before, after, bounced, tally, gen)) return false;
  for (const auto& [ns, secret] : secrets_) {
    for (const auto& ctx : store_.list(ns)) {
      auto stats = store_.stat(ns, ctx);
      if (!stats.ok()) continue;  // removed meanwhile
      std::set<std::string> received;  // new owners that took (or had) objects of ctx in this pass
      for (const auto& cs : *stats) {
        const std::string key = HashRing::chunk_key(ctx, cs.chunk);
        const auto old_owners = before.replicas(key, cfg_.replication);
        // The sender: the first old owner still a member (so exactly one node sends).
        const auto sender = std::find_if(old_owners.begin(), old_owners.end(),
                                         [&](const std::string& o) { return members.count(o) > 0; });
        if (sender == old_owners.end() || *sender != self_) continue;
        std::vector<std::string> to;
        for (const auto& n : after.replicas(key, cfg_.replication))
          if (n != self_ && std::find(old_owners.begin(), old_owners.end(), n) == old_owners.end()) to.push_back(n);
        for (uint32_t level = 0; level < cs.level_bytes.size() && !to.empty(); ++level) {
          if (cs.level_bytes[level] == 0) continue;
          // The owners an earlier pass for this change did not deliver to.
          std::vector<std::pair<std::string, uint64_t>> due;
          for (const auto& node : to) {
            const uint64_t id = delivery_id(ns, ctx, cs.chunk, level, node);
            if (!delivered_.contains(id)) due.emplace_back(node, id);
          }
          if (due.empty()) continue;
          // The copy is held in memory under the node's budget, beside the requests it
          // serves; without room now it waits for the next pass.
          auto held = budget_.acquire(cs.level_bytes[level]);
          if (!held.ok()) {
            tally.objects_failed += due.size();
            continue;
          }
          const storage::ObjectKey okey{ns, ctx, cs.chunk, level};
          auto obj = store_.read_stored(okey);
          if (!obj.ok()) {
            if (obj.status().code() != StatusCode::not_found) tally.objects_failed += due.size();
            continue;
          }
          for (const auto& [node, id] : due) {
            const Status s = peers.send(okey, *obj, node);
            if (s.ok()) {
              ++tally.objects_copied;
              tally.bytes_copied += obj->bytes.size();
              delivered_.insert(id);
              received.insert(node);
            } else if (s.code() == StatusCode::already_exists) {
              ++tally.objects_present;
              delivered_.insert(id);
              received.insert(node);
            } else {
              ++tally.objects_failed;
            }
            if (!pace(s.ok() ? obj->bytes.size() : 0, gen)) return false;
          }
        }
      }
      send_use_mark(peers, ns, ctx, received);
    }
  }
  return true;
}

bool Rebalancer::hand_on_removes(PeerClients& peers, const HashRing& before, const HashRing& after,
                                 const std::set<std::string>& bounced, Tally& tally, uint64_t gen) {
  std::vector<std::string> joined;
  const auto& was = before.nodes();
  for (const auto& n : after.nodes())
    if (n != self_ && (std::find(was.begin(), was.end(), n) == was.end() || bounced.contains(n))) joined.push_back(n);
  if (joined.empty()) return true;
  // The senders are among the nodes that stayed: a bounced node may hold none of the
  // removes made while it was out.
  std::vector<std::string> stayed;
  for (const auto& n : was)
    if (!bounced.contains(n)) stayed.push_back(n);
  std::optional<HashRing> without_bounced;  // built only where some node bounced
  if (stayed.size() != was.size()) without_bounced = ring_of(stayed, cfg_.virtual_nodes);
  const HashRing& senders_ring = without_bounced ? *without_bounced : before;
  // A node takes up to 1 MiB of removes per request, remembered with one sync; slices
  // of this many keep a newer change from waiting on a long list.
  constexpr size_t kSlice = 4096;
  for (const auto& [ns, secret] : secrets_) {
    // The remove reached every member of `before` that stayed; the owners of the
    // context's first chunk among them hand it on (R senders, not every member).
    std::vector<storage::ContextRemove> mine;
    for (auto& [ctx, version] : store_.removed(ns)) {
      const auto senders = senders_ring.replicas(HashRing::chunk_key(ctx, 0), cfg_.replication);
      if (std::find(senders.begin(), senders.end(), self_) != senders.end())
        mine.push_back({std::move(ctx), version});
    }
    for (const auto& node : joined) {
      std::vector<storage::ContextRemove> due;
      std::vector<uint64_t> ids;
      for (const auto& r : mine) {
        const uint64_t id = delivery_id(ns, r.context, kRemoveDelivery, kRemoveDelivery, node);
        if (!delivered_.contains(id)) due.push_back(r), ids.push_back(id);
      }
      storage::Client* c = due.empty() ? nullptr : peers.get(ns, node);
      for (size_t first = 0; first < due.size(); first += kSlice) {
        const size_t n = std::min(kSlice, due.size() - first);
        // unsupported: a node from before versioned removes, which cannot be told.
        const Status s = c ? c->remove_many(std::span(due).subspan(first, n), Clock::now() + cfg_.etcd.request_timeout,
                                            stop_)
                           : Status(StatusCode::unavailable, "not connected");
        if (s.ok() || s.code() == StatusCode::unsupported) {
          delivered_.insert(ids.begin() + first, ids.begin() + first + n);
          if (s.ok()) tally.removes_handed_on += n;
        } else {
          KVS_LOG_DEBUG("rebalance: {} removes did not reach {}: {}", n, node, s.to_string());
          tally.objects_failed += n;
        }
        if (!current(gen)) return false;
      }
    }
  }
  return true;
}

void Rebalancer::send_use_mark(PeerClients& peers, const std::string& ns, const std::string& ctx,
                               const std::set<std::string>& to) {
  // Best effort: a node from before marks answers unsupported.
  const storage::UseMark mark = store_.use_mark(ns, ctx);
  if (mark.stamp == 0) return;
  for (const auto& node : to)
    if (storage::Client* c = peers.get(ns, node)) {
      const storage::ContextTouch t{ctx, mark.depth};
      if (Status s = c->touch(std::span(&t, 1), mark.stamp, Clock::now() + 30s, stop_); !s.ok())
        KVS_LOG_DEBUG("rebalance: the use mark of '{}' did not reach {}: {}", ctx, node, s.to_string());
    }
}

}  // namespace kvstream::cluster

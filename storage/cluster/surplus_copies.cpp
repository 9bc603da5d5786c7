// Dropping the copies a node holds of chunks it no longer owns (surplus_copies.hpp):
// the check per copy, and the rebalancer's pass over its store.
#include "storage/cluster/surplus_copies.hpp"

#include <algorithm>
#include <optional>
#include <set>

#include <fmt/ranges.h>

#include "core/log.hpp"
#include "kvstream/cluster.hpp"
#include "storage/cluster/peer_clients.hpp"
#include "storage/cluster/rebalancer.hpp"
#include "storage/node_features.hpp"

namespace kvstream::cluster {

using transport::Clock;

OwnerHolds owner_holds(uint32_t chunk, uint32_t level, uint64_t version, const std::vector<storage::ChunkStat>& stats) {
  const auto s = std::find_if(stats.begin(), stats.end(), [&](const storage::ChunkStat& c) { return c.chunk == chunk; });
  if (s == stats.end() || level >= s->level_bytes.size() || s->level_bytes[level] == 0) return OwnerHolds::none;
  if (s->level_versions.size() <= level) return OwnerHolds::unsaid;
  return s->level_versions[level] < version ? OwnerHolds::older : OwnerHolds::same_or_newer;
}

SurplusPlan plan_surplus(std::span<const OwnerHolds> holds) {
  SurplusPlan plan;
  // An owner that holds a copy without saying which write may hold an older one: this
  // copy could then be the newest, and a node from before versions cannot be sent
  // a write conditionally on it either.
  if (std::find(holds.begin(), holds.end(), OwnerHolds::unsaid) != holds.end()) {
    plan.action = SurplusPlan::Action::keep;
    return plan;
  }
  for (size_t i = 0; i < holds.size(); ++i)
    if (holds[i] != OwnerHolds::same_or_newer) plan.to.push_back(i);
  plan.action = plan.to.empty() ? SurplusPlan::Action::drop : SurplusPlan::Action::hand_over;
  return plan;
}

bool Rebalancer::current(uint64_t gen) {
  std::lock_guard lock(mu_);
  return !stopping_ && generation_ == gen;
}

void Rebalancer::fence_waits(const std::vector<std::string>& whom, std::string_view why) {
  if (!store_.fenced()) return;
  if (const auto lasted = fence_wait_.waiting(Clock::now()))
    KVS_LOG_WARN("rebalance: node {} has served nothing it held for {:.0f} s: it waits on {} ({})", self_,
                 std::chrono::duration<double>(*lasted).count(), fmt::join(whom, ", "), why);
}

bool Rebalancer::settle_fence(const HashRing& members, const std::vector<MigrationReport>& reports) {
  const auto late = store_.forgotten_namespaces(horizons_of(reports));
  if (late.empty()) {
    store_.lift_fence();
    return true;
  }
  const auto began = Clock::now();
  uint64_t listings_read = 0, stats_asked = 0;  // for the log line below
  PeerClients peers(self_, backend_, secrets_, stop_);
  // A listing of a namespace is pages of 4096 contexts: a bound for the whole of it.
  constexpr auto kListingTimeout = std::chrono::seconds(60);
  // Another member, and the contexts of a namespace it serves: its usage listing,
  // where it lists only what it serves (kFeatureServedOnly). None where it does not
  // (a node from before that) or its listing failed: each context is then asked
  // with a stat (which leaves its fenced objects out), one request each.
  struct Other {
    storage::Client* client;  // null: unreachable
    std::optional<std::set<std::string>> serves;
  };
  const auto other = [&](const std::string& ns, const std::string& node) {
    Other o{peers.get(ns, node), std::nullopt};
    if (!o.client || !(storage::node_features(*o.client) & storage::kFeatureServedOnly)) return o;
    ++listings_read;
    auto u = o.client->usage("", Clock::now() + kListingTimeout, stop_);
    if (!u.ok()) return o;
    o.serves.emplace();
    for (auto& cu : *u) o.serves->insert(std::move(cu.context));
    return o;
  };
  enum class Held { elsewhere, nowhere, unsure };
  // Whether another member holds any of `ctx` (one that cannot be asked leaves it unsure).
  const auto held = [&](const std::vector<Other>& others, const std::string& ctx) {
    Held verdict = Held::nowhere;
    for (const Other& o : others) {
      if (o.serves) {
        if (o.serves->contains(ctx)) return Held::elsewhere;
        continue;
      }
      stats_asked += o.client != nullptr;
      auto r = o.client ? o.client->stat(ctx, Clock::now() + cfg_.etcd.request_timeout, stop_)
                        : Result<std::vector<storage::ChunkStat>>(Status(StatusCode::unavailable, "unreachable"));
      if (r.ok() && !r->empty()) return Held::elsewhere;
      if (!r.ok() && r.status().code() != StatusCode::not_found) verdict = Held::unsure;
    }
    return verdict;
  };
  uint64_t dropped = 0, kept = 0;
  for (const auto& ns : late) {
    const auto contexts = store_.held_contexts(ns);
    if (contexts.empty()) continue;
    // No secret for the namespace: its peers cannot be asked, and what it holds goes.
    std::vector<Other> others;
    if (secrets_.contains(ns))
      for (const auto& node : members.nodes())
        if (node != self_) others.push_back(other(ns, node));
    std::set<std::string> gone;
    for (const auto& ctx : contexts) {
      const Held h = held(others, ctx);
      if (h == Held::unsure) return false;
      if (h == Held::elsewhere) ++kept;
      else gone.insert(ctx);
    }
    auto went = store_.drop_held(
        [&](const std::string& space, const std::string& ctx) { return space == ns && gone.contains(ctx); });
    if (!went.ok()) return false;
    dropped += *went;
  }
  KVS_LOG_WARN("rebalance: node {}: a member may have forgotten removes made since it was last a member (of {} "
               "namespaces): dropped the {} objects it held of contexts no other member holds; {} contexts the "
               "others hold stay (asked in {:.2f} s: {} listings, {} stats)",
               self_, late.size(), dropped, kept, std::chrono::duration<double>(Clock::now() - began).count(),
               listings_read, stats_asked);
  store_.lift_fence();
  return true;
}

Rebalancer::TrimResult Rebalancer::trim(const Members& members, uint64_t gen, Tally& tally,
                                        const std::set<std::pair<std::string, std::string>>* only) {
  if (!cfg_.trim_surplus && !store_.fenced()) return TrimResult::finished;  // nothing to lift, nothing to drop
  const HashRing& ring = members.ring;
  // Until every member has copied for this set, an owner may lack a chunk only because
  // its sender has not reached it yet: try again later rather than keep the copy.
  const std::set<std::string> want(ring.nodes().begin(), ring.nodes().end());
  auto reports = migration_reports(cfg_.etcd, Clock::now() + cfg_.etcd.request_timeout, stop_);
  if (!reports.ok()) return current(gen) ? TrimResult::again : TrimResult::cut;
  std::set<std::string> finished;
  std::vector<MigrationReport> theirs;
  for (MigrationReport& r : *reports)
    if (r.done && std::set<std::string>(r.members.begin(), r.members.end()) == want) {
      finished.insert(r.node);
      theirs.push_back(std::move(r));
    }
  if (finished != want) {
    std::vector<std::string> missing;
    for (const auto& n : want)
      if (!finished.contains(n)) missing.push_back(n);
    fence_waits(missing, "no report of a finished pass for this member set");
    return current(gen) ? TrimResult::again : TrimResult::cut;
  }
  if (want.contains(self_)) {
    // A member's report for the same addresses from before this node registered (its
    // start, or again after its lease ran out) says nothing of the removes made while
    // it was out: that member's pass for the return, which hands them on, has not
    // reported yet (it is busy, or its watch is behind). A report that does not say
    // (a node from before registrations were reported) is taken as it was before.
    const auto it = members.set.registered.find(self_);
    const int64_t mine = it == members.set.registered.end() ? 0 : it->second;
    std::vector<std::string> behind;
    for (const MigrationReport& r : theirs)
      if (r.node != self_ && r.members_revision != 0 && r.members_revision < mine) behind.push_back(r.node);
    if (!behind.empty()) {
      fence_waits(behind, fmt::format("their reports are from before its registration at revision {}", mine));
      return current(gen) ? TrimResult::again : TrimResult::cut;
    }
    // Every member has rebalanced for a set with this node in it, and so handed it
    // the removes it remembers: what this node held before it joined can be served,
    // but for what a member may have forgotten since it was away. (A set without it
    // says nothing of that: a node its cluster dropped while it ran may see that set
    // after it fenced, before it is a member again.)
    if (!settle_fence(ring, theirs)) return current(gen) ? TrimResult::again : TrimResult::cut;
    fence_wait_.ended();
  }
  if (!cfg_.trim_surplus) return TrimResult::finished;  // the surplus copies stay

  PeerClients peers(self_, backend_, secrets_, stop_);
  // Counted afresh by each look at every context; what was dropped stays counted.
  if (!only) tally.objects_kept = 0;
  uint64_t unsaid = 0, refused = 0;
  bool again = false;
  struct Copy {
    uint32_t chunk = 0, level = 0;
    uint64_t version = 0, bytes = 0;
    std::vector<std::string> owners;
  };
  { // Hand-overs keep to the rate bound, counted from here.
    std::lock_guard lock(mu_);
    pace_start_ = Clock::now(), paced_bytes_ = 0;
  }
  for (const auto& [ns, secret] : secrets_) {
    std::vector<std::string> contexts;
    if (!only) contexts = store_.list(ns);
    else
      for (auto it = only->lower_bound({ns, ""}); it != only->end() && it->first == ns; ++it) contexts.push_back(it->second);
    for (const auto& ctx : contexts) {
      if (!current(gen)) return TrimResult::cut;
      auto stats = store_.stat(ns, ctx);
      if (!stats.ok()) continue;  // removed meanwhile
      std::vector<Copy> copies;
      for (const auto& cs : *stats) {
        auto owners = ring.replicas(HashRing::chunk_key(ctx, cs.chunk), cfg_.replication);
        if (std::find(owners.begin(), owners.end(), self_) != owners.end()) continue;
        for (uint32_t level = 0; level < cs.level_bytes.size(); ++level)
          if (cs.level_bytes[level] != 0)
            copies.push_back({cs.chunk, level, level < cs.level_versions.size() ? cs.level_versions[level] : 0,
                              cs.level_bytes[level], owners});
      }
      if (copies.empty()) continue;
      // Each owner's view of the context, asked once; empty: it holds none of it.
      std::map<std::string, std::vector<storage::ChunkStat>> seen;
      std::set<std::string> silent;
      for (const Copy& copy : copies)
        for (const auto& owner : copy.owners) {
          if (seen.contains(owner) || silent.contains(owner)) continue;
          storage::Client* c = peers.get(ns, owner);
          auto r = c ? c->stat(ctx, Clock::now() + cfg_.etcd.request_timeout, stop_)
                     : Result<std::vector<storage::ChunkStat>>(Status(StatusCode::unavailable, "unreachable"));
          if (r.ok()) seen[owner] = std::move(r).value();
          else if (r.status().code() == StatusCode::not_found) seen[owner] = {};
          else {
            silent.insert(owner);
            if (c) peers.drop(ns, owner);
          }
        }
      std::set<std::string> received;  // owners handed objects of ctx
      for (const Copy& copy : copies) {
        if (std::any_of(copy.owners.begin(), copy.owners.end(), [&](const auto& o) { return silent.contains(o); })) {
          again = true;
          continue;
        }
        std::vector<OwnerHolds> holds;
        for (const auto& o : copy.owners) holds.push_back(owner_holds(copy.chunk, copy.level, copy.version, seen.at(o)));
        const SurplusPlan plan = plan_surplus(holds);
        if (plan.action == SurplusPlan::Action::keep) {
          ++tally.objects_kept, ++unsaid;
          continue;
        }
        const storage::ObjectKey key{ns, ctx, copy.chunk, copy.level};
        if (plan.action == SurplusPlan::Action::hand_over) {
          std::vector<std::string> to;
          for (size_t i : plan.to) to.push_back(copy.owners[i]);
          switch (hand_over(peers, key, copy.version, copy.bytes, to, gen, tally, received)) {
            case HandOver::delivered: break;
            case HandOver::gone: continue;
            case HandOver::refused: ++tally.objects_kept, ++refused; continue;
            case HandOver::again: again = true; continue;
            case HandOver::cut: return TrimResult::cut;
          }
        }
        // Only the write that was checked (and handed over): one that landed since
        // stays, and a later look judges it afresh.
        auto freed = store_.remove_object(key, copy.version);
        if (freed.ok()) ++tally.objects_trimmed, tally.bytes_trimmed += *freed;
        else if (freed.status().code() != StatusCode::not_found) again = true;
      }
      send_use_mark(peers, ns, ctx, received);
    }
  }
  if (tally.objects_kept > 0)
    KVS_LOG_INFO("rebalance: node {} keeps {} copies of chunks it no longer owns: an owner does not say its versions "
                 "for {}, refused {} handed over",
                 self_, tally.objects_kept, unsaid, refused);
  return again ? TrimResult::again : TrimResult::finished;
}

Rebalancer::HandOver Rebalancer::hand_over(PeerClients& peers, const storage::ObjectKey& key, uint64_t version,
                                           uint64_t bytes, const std::vector<std::string>& to, uint64_t gen,
                                           Tally& tally, std::set<std::string>& received) {
  // Held in memory under the node's budget, as a pass's copies are.
  auto held = budget_.acquire(bytes);
  if (!held.ok()) return HandOver::again;
  auto obj = store_.read_stored(key);
  if (!obj.ok()) return obj.status().code() == StatusCode::not_found ? HandOver::gone : HandOver::again;
  if (obj->version != version) return HandOver::again;  // a write landed since the check
  // Sent as the pass sends, and conditional on it: an owner that got a newer write
  // meanwhile keeps that one.
  bool again = false, refused = false;
  for (const auto& node : to) {
    const Status s = peers.send(key, *obj, node);
    if (s.ok()) {
      ++tally.objects_handed_over, tally.bytes_handed_over += obj->bytes.size();
      received.insert(node);
    } else if (s.code() == StatusCode::unavailable || s.code() == StatusCode::timed_out ||
               s.code() == StatusCode::cancelled) {
      again = true;
    } else if (s.code() != StatusCode::already_exists) {
      // Out of space, a quota: the copy stays here, where it is still read from.
      KVS_LOG_WARN("rebalance: {} refused {} of a chunk node {} no longer owns: {}", node, key.name(), self_,
                   s.to_string());
      refused = true;
    }
    if (!pace(s.ok() ? obj->bytes.size() : 0, gen)) return HandOver::cut;
  }
  return again ? HandOver::again : refused ? HandOver::refused : HandOver::delivered;
}

}  // namespace kvstream::cluster

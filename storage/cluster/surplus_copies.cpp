// Dropping the copies a node holds of chunks it no longer owns (surplus_copies.hpp):
// the check per copy, and the rebalancer's pass over its store.
#include "storage/cluster/surplus_copies.hpp"

#include <algorithm>
#include <set>

#include "core/log.hpp"
#include "kvstream/cluster.hpp"
#include "storage/cluster/peer_clients.hpp"
#include "storage/cluster/rebalancer.hpp"

namespace kvstream::cluster {

using transport::Clock;

SurplusVerdict judge_surplus(uint32_t chunk, uint32_t level, uint64_t version,
                             std::span<const std::vector<storage::ChunkStat>* const> owners) {
  SurplusVerdict verdict = SurplusVerdict::drop;
  for (const std::vector<storage::ChunkStat>* stats : owners) {
    const auto s = std::find_if(stats->begin(), stats->end(),
                                [&](const storage::ChunkStat& c) { return c.chunk == chunk; });
    if (s == stats->end() || level >= s->level_bytes.size() || s->level_bytes[level] == 0)
      return SurplusVerdict::owner_lacks;
    // A copy that may be the only one of its write outranks a copy whose owner merely
    // does not say: the strongest reason to keep it is the one reported.
    if (s->level_versions.size() <= level) {
      if (verdict == SurplusVerdict::drop) verdict = SurplusVerdict::unknown;
    } else if (s->level_versions[level] < version) {
      verdict = SurplusVerdict::owner_older;
    }
  }
  return verdict;
}

bool Rebalancer::current(uint64_t gen) {
  std::lock_guard lock(mu_);
  return !stopping_ && generation_ == gen;
}

Rebalancer::TrimResult Rebalancer::trim(const std::vector<std::string>& members, uint64_t gen, Tally& tally) {
  // Until every member has copied for this set, an owner may lack a chunk only because
  // its sender has not reached it yet: try again later rather than keep the copy.
  const std::set<std::string> want(members.begin(), members.end());
  auto reports = migration_reports(cfg_.etcd, Clock::now() + cfg_.etcd.request_timeout, stop_);
  if (!reports.ok()) return current(gen) ? TrimResult::again : TrimResult::cut;
  std::set<std::string> finished;
  for (const MigrationReport& r : *reports)
    if (r.done && std::set<std::string>(r.members.begin(), r.members.end()) == want) finished.insert(r.node);
  if (finished != want) return current(gen) ? TrimResult::again : TrimResult::cut;

  HashRing ring(cfg_.virtual_nodes);
  for (const auto& m : members) (void)ring.add(m);
  PeerClients peers(self_, backend_, secrets_, stop_);
  tally.objects_kept = 0;  // counted afresh each time; what was dropped stays counted
  uint64_t lacks = 0, older = 0, unknown = 0;
  bool again = false;
  struct Copy {
    uint32_t chunk = 0, level = 0;
    uint64_t version = 0;
    std::vector<std::string> owners;
  };
  for (const auto& [ns, secret] : secrets_) {
    for (const auto& ctx : store_.list(ns)) {
      if (!current(gen)) return TrimResult::cut;
      auto stats = store_.stat(ns, ctx);
      if (!stats.ok()) continue;  // removed meanwhile
      std::vector<Copy> copies;
      for (const auto& cs : *stats) {
        auto owners = ring.replicas(HashRing::chunk_key(ctx, cs.chunk), cfg_.replication);
        if (std::find(owners.begin(), owners.end(), self_) != owners.end()) continue;
        for (uint32_t level = 0; level < cs.level_bytes.size(); ++level)
          if (cs.level_bytes[level] != 0)
            copies.push_back({cs.chunk, level, level < cs.level_versions.size() ? cs.level_versions[level] : 0, owners});
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
      for (const Copy& copy : copies) {
        if (std::any_of(copy.owners.begin(), copy.owners.end(), [&](const auto& o) { return silent.contains(o); })) {
          again = true;
          continue;
        }
        std::vector<const std::vector<storage::ChunkStat>*> views;
        for (const auto& o : copy.owners) views.push_back(&seen.at(o));
        switch (judge_surplus(copy.chunk, copy.level, copy.version, views)) {
          case SurplusVerdict::drop: {
            // Only the write that was checked: one that landed since stays.
            auto freed = store_.remove_object({ns, ctx, copy.chunk, copy.level}, copy.version);
            if (freed.ok()) ++tally.objects_trimmed, tally.bytes_trimmed += *freed;
            else if (freed.status().code() == StatusCode::already_exists) ++tally.objects_kept, ++older;
            else if (freed.status().code() != StatusCode::not_found) again = true;
            break;
          }
          case SurplusVerdict::owner_lacks: ++tally.objects_kept, ++lacks; break;
          case SurplusVerdict::owner_older: ++tally.objects_kept, ++older; break;
          case SurplusVerdict::unknown: ++tally.objects_kept, ++unknown; break;
        }
      }
    }
  }
  if (tally.objects_kept > 0)
    KVS_LOG_INFO("rebalance: node {} keeps {} copies of chunks it no longer owns: an owner lacks {}, holds an older "
                 "write of {}, does not say its versions for {}",
                 self_, tally.objects_kept, lacks, older, unknown);
  return again ? TrimResult::again : TrimResult::finished;
}

}  // namespace kvstream::cluster

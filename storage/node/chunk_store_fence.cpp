// ChunkStore and the objects it held when it opened, or when it was about to rejoin its
// cluster: the fence that keeps them from readers until a node back in its cluster has
// been handed the removes made while it was away, the drop of them all when it was
// away longer than removes are remembered (member_mark.hpp), and what the rebalancer
// looks at where a member may have forgotten a remove made meanwhile (the namespaces,
// their held contexts, the drop of those it picks).
#include <algorithm>
#include <map>
#include <utility>

#include "core/log.hpp"
#include "storage/node/chunk_store.hpp"

namespace kvstream::storage {

void ChunkStore::fence_held_at_open() {
  std::lock_guard lock(mu_);
  fenced_ = true;
}

void ChunkStore::lift_fence() {
  std::lock_guard lock(mu_);
  if (!fenced_) return;
  fenced_ = false;
  KVS_LOG_INFO("store '{}': serving the objects it held before it came back ({} gets refused until now)", dir_,
               fenced_gets_.load(std::memory_order_relaxed));
}

bool ChunkStore::fenced() const {
  std::lock_guard lock(mu_);
  return fenced_;
}

void ChunkStore::set_tombstone_limits(Tombstones::Limits limits) {
  tombstones_.set_limits(limits);
  std::lock_guard lock(member_mu_);
  member_mark_every_ = std::clamp<std::chrono::seconds>(limits.ttl / 8, std::chrono::seconds(1), kMemberMarkEvery);
}

Status ChunkStore::note_member(std::chrono::system_clock::time_point now) {
  std::lock_guard lock(member_mu_);
  // Once a minute is close enough beside a memory of removes counted in hours, and
  // keeps a sync off every lease renewal.
  if (member_written_ && now >= *member_written_ && now - *member_written_ < member_mark_every_) return {};
  KVS_RETURN_IF_ERROR(write_member_mark(dir_, now));
  member_written_ = now;
  return {};
}

std::vector<std::string> ChunkStore::forgotten_namespaces(
    const std::map<std::string, std::chrono::system_clock::time_point>& horizons) const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  if (!fenced_ || !away_since_) return out;
  for (const auto& [ns, horizon] : horizons)
    if (horizon > *away_since_ && index_.contains(ns)) out.push_back(ns);
  return out;
}

std::vector<std::string> ChunkStore::held_contexts(const std::string& ns) const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  const auto n = index_.find(ns);
  if (n == index_.end()) return out;
  for (const auto& [ctx, c] : n->second) {
    const bool held = std::any_of(c.chunks.begin(), c.chunks.end(), [](const auto& chunk) {
      return std::any_of(chunk.second.begin(), chunk.second.end(),
                         [](const Entry& e) { return e.generation != 0 && e.held_at_fence; });
    });
    if (held) out.push_back(ctx);
  }
  return out;
}

Result<uint64_t> ChunkStore::drop_held(const std::function<bool(const std::string& ns, const std::string& ctx)>& which) {
  std::map<std::pair<std::string, std::string>, std::vector<std::pair<uint32_t, uint32_t>>> held;
  {
    std::lock_guard lock(mu_);
    for (const auto& [ns, contexts] : index_) {
      for (const auto& [ctx, c] : contexts) {
        if (which && !which(ns, ctx)) continue;
        for (const auto& [chunk, levels] : c.chunks)
          for (uint32_t level = 0; level < levels.size(); ++level)
            if (levels[level].generation != 0 && levels[level].held_at_fence) held[{ns, ctx}].emplace_back(chunk, level);
      }
    }
  }
  uint64_t dropped = 0;
  for (const auto& [id, objects] : held) {
    const auto& [ns, ctx] = id;
    // The context's stripe: no commit replaces one of these objects between the look
    // below and its unlink (one that did before is a write since the open, and stays).
    std::lock_guard stripe_lock(stripe(ns, ctx));
    std::vector<ObjectKey> going;
    {
      std::lock_guard lock(mu_);
      for (const auto& [chunk, level] : objects) {
        ObjectKey k{ns, ctx, chunk, level};
        if (const Entry* e = entry_locked(k); e && e->generation != 0 && e->held_at_fence) going.push_back(std::move(k));
      }
    }
    KVS_RETURN_IF_ERROR(delete_objects_locked(ns, ctx, going));
    dropped += going.size();
  }
  return dropped;
}

Result<uint64_t> ChunkStore::fence_or_drop(std::chrono::seconds remove_memory, std::optional<std::chrono::seconds> away,
                                          std::string_view since) {
  // The fence goes up first: a drop that fails part way leaves the rest unserved.
  fence_held_at_open();
  if (remove_memory.count() <= 0 || !away || *away <= remove_memory) return uint64_t(0);
  KVS_ASSIGN_OR_RETURN(uint64_t dropped, drop_held());
  KVS_LOG_WARN("store '{}': last a cluster member {} s ago ({}), longer than removes are remembered ({} s): "
               "dropped the {} objects it held, as the members may have forgotten removes of them",
               dir_, away->count(), since, remove_memory.count(), dropped);
  return dropped;
}

Result<uint64_t> ChunkStore::come_back(std::chrono::seconds remove_memory, std::chrono::system_clock::time_point now) {
  {
    std::lock_guard lock(mu_);
    away_since_ = member_at_open_;
  }
  std::optional<std::chrono::seconds> away;
  if (member_at_open_ && now > *member_at_open_)
    away = std::chrono::duration_cast<std::chrono::seconds>(now - *member_at_open_);
  return fence_or_drop(remove_memory, away, "its member mark at start");
}

Result<uint64_t> ChunkStore::rejoin(std::chrono::seconds away) {
  std::vector<Bytes> uncached;  // released after the lock
  {
    std::lock_guard lock(mu_);
    for (auto& [ns, contexts] : index_)
      for (auto& [ctx, c] : contexts)
        for (auto& [chunk, levels] : c.chunks)
          for (Entry& e : levels) e.held_at_fence = e.generation != 0;
    fenced_ = true;  // with the marks: no get caches a held object between the two
    away_since_ = std::chrono::system_clock::now() - away;
    // A get answers from the cache before it looks at the index: what is held goes
    // from there (fenced objects are not cached again until the fence lifts).
    for (auto& [key, bytes] : lru_) uncached.push_back(std::move(bytes));
    lru_.clear(), cache_.clear(), cache_used_ = 0;
  }
  return fence_or_drop(tombstones_.limits().ttl, away, "dropped by its cluster while it ran");
}

}  // namespace kvstream::storage

// ChunkStore's use marks and usage listing (Client::touch and Client::usage): what a
// client that evicts by use reads in one reply instead of a stat and a read per
// context.
#include <algorithm>

#include "storage/node/chunk_store.hpp"

namespace kvstream::storage {

Result<uint32_t> ChunkStore::touch(const std::string& ns, std::span<const ContextTouch> touches, uint64_t stamp) {
  KVS_RETURN_IF_ERROR(validate_id(ns, kMaxNamespaceBytes, "namespace"));
  uint32_t stored = 0;
  Status first_error;
  for (const ContextTouch& t : touches) {
    KVS_RETURN_IF_ERROR(validate_id(t.context, kMaxContextBytes, "context id"));
    // The context's stripe: a remove (which deletes the directory) or a commit (which
    // may create it) comes wholly before or after this mark's write.
    std::lock_guard stripe_lock(stripe(ns, t.context));
    UseMark mark;
    {
      std::lock_guard lock(mu_);
      auto n = index_.find(ns);
      if (n == index_.end()) break;  // nothing of this namespace is stored
      auto c = n->second.find(t.context);
      if (c == n->second.end()) continue;
      ++stored;
      UseMark& use = c->second.use;
      if (stamp < use.stamp || (stamp == use.stamp && t.depth == use.depth)) continue;
      use = {stamp, t.depth};
      mark = use;
      marks_raised_.fetch_add(1, std::memory_order_relaxed);
    }
    if (Status s = write_use_mark(context_dir(ns, t.context), mark); !s.ok() && first_error.ok()) first_error = s;
  }
  if (!first_error.ok()) return first_error;
  return stored;
}

UseMark ChunkStore::use_mark(const std::string& ns, const std::string& ctx) const {
  std::lock_guard lock(mu_);
  auto n = index_.find(ns);
  if (n == index_.end()) return {};
  auto c = n->second.find(ctx);
  return c == n->second.end() ? UseMark{} : c->second.use;
}

std::vector<ContextUsage> ChunkStore::usage(const std::string& ns, const std::string& prefix, const std::string& after,
                                            uint32_t limit, uint64_t max_bytes) const {
  std::vector<ContextUsage> out;
  std::lock_guard lock(mu_);
  auto n = index_.find(ns);
  if (n == index_.end()) return out;
  const auto& contexts = n->second;
  // Names sort, so the prefix's contexts are one run: from the first at or after it
  // (and after `after`) until the first that does not start with it.
  auto it = after.empty() || after < prefix ? contexts.lower_bound(prefix) : contexts.upper_bound(after);
  uint64_t bytes = 4;  // the count
  for (; it != contexts.end() && out.size() < limit && (out.empty() || bytes < max_bytes); ++it) {
    const auto& [name, ctx] = *it;
    if (!name.starts_with(prefix)) break;
    if (!served_locked(ctx)) continue;  // behind the fence: as if not here (kFeatureServedOnly)
    ContextUsage u;
    u.context = name;
    for (const auto& [chunk, levels] : ctx.chunks) {
      bool present = false;
      for (const Entry& e : levels) {
        if (e.generation == 0 || fenced_locked(e)) continue;
        present = true;
        u.bytes += e.size;
        u.written = std::max(u.written, e.version);
      }
      if (present) u.chunks.push_back(chunk);
    }
    u.used = ctx.use.stamp, u.depth = ctx.use.depth;
    bytes += usage_wire_bytes(u);
    out.push_back(std::move(u));
  }
  return out;
}

}  // namespace kvstream::storage

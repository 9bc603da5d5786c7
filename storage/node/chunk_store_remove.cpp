// ChunkStore's removes: a context's writes up to a version (remembered in the
// tombstones before anything goes, so a commit they cover is refused), one object
// while it holds the write that was checked (the surplus trim), and the files and
// directories that go with them.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include <unistd.h>

#include "core/log.hpp"
#include "storage/node/chunk_store.hpp"

namespace kvstream::storage {

namespace fs = std::filesystem;

Status ChunkStore::remove(const std::string& ns, const std::string& ctx, uint64_t max_version) {
  KVS_RETURN_IF_ERROR(validate_id(ns, kMaxNamespaceBytes, "namespace"));
  KVS_RETURN_IF_ERROR(validate_id(ctx, kMaxContextBytes, "context id"));
  std::lock_guard stripe_lock(stripe(ns, ctx));
  constexpr uint64_t kAll = std::numeric_limits<uint64_t>::max();
  // Remembered first (a remove the node cannot remember is not done): one that names
  // its version at it, even where nothing is here, as this node may be sent a copy
  // of the context later; one that names none (a client from before them) at the
  // newest write it finds.
  uint64_t remembered = max_version;
  if (max_version == kAll) {
    std::lock_guard lock(mu_);
    remembered = 0;
    if (auto n = index_.find(ns); n != index_.end())
      if (auto c = n->second.find(ctx); c != n->second.end())
        for (const auto& [chunk, levels] : c->second.chunks)
          for (const Entry& e : levels)
            if (e.generation != 0) remembered = std::max(remembered, e.version);
  }
  if (remembered > 0) KVS_RETURN_IF_ERROR(tombstones_.record(ns, ctx, remembered));
  return delete_up_to_locked(ns, ctx, max_version);
}

Status ChunkStore::remove_many(const std::string& ns, std::span<const ContextRemove> removes) {
  KVS_RETURN_IF_ERROR(validate_id(ns, kMaxNamespaceBytes, "namespace"));
  for (const ContextRemove& r : removes) {
    KVS_RETURN_IF_ERROR(validate_id(r.context, kMaxContextBytes, "context id"));
    if (r.version == 0) return make_status(StatusCode::invalid_argument, "a remove of '{}' up to version 0", r.context);
  }
  // Remembered before anything goes: a commit the removes cover is refused from here.
  KVS_RETURN_IF_ERROR(tombstones_.record_many(ns, removes));
  for (const ContextRemove& r : removes) {
    std::lock_guard stripe_lock(stripe(ns, r.context));
    if (Status s = delete_up_to_locked(ns, r.context, r.version); !s.ok() && s.code() != StatusCode::not_found)
      return s;
  }
  return {};
}

Status ChunkStore::delete_up_to_locked(const std::string& ns, const std::string& ctx, uint64_t max_version) {
  std::vector<ObjectKey> older;  // where a newer write stays: the objects to delete one by one
  bool whole = false;            // no newer write: the context goes whole
  {
    std::lock_guard lock(mu_);
    auto n = index_.find(ns);
    if (n == index_.end()) return make_status(StatusCode::not_found, "no context '{}'", ctx);
    auto c = n->second.find(ctx);
    if (c == n->second.end()) return make_status(StatusCode::not_found, "no context '{}'", ctx);
    bool newer = false;
    for (const auto& [chunk, levels] : c->second.chunks)
      for (uint32_t level = 0; level < levels.size(); ++level) {
        const Entry& e = levels[level];
        if (e.generation == 0) continue;
        if (e.version > max_version) newer = true;
        else older.push_back(ObjectKey{ns, ctx, chunk, level});
      }
    if (!newer) {
      for (const auto& [chunk, levels] : c->second.chunks)
        for (const Entry& e : levels) {
          under_old_keys_ -= e.generation != 0 && e.key_id != current_key_id_;
          if (e.generation != 0) quota_.stored(ns, disk_charge(e), 0);
        }
      n->second.erase(c);
      quota_.stored(ns, context_charge(), 0);
      cache_drop_prefix_locked(ns + "/" + ctx + "/");
      whole = true;
    }
  }
  if (whole) return remove_context_dir(ns, ctx);
  // Every write is newer than the remove: they stay, and so do their files (the
  // directory went with them once, leaving the index naming files no longer there).
  return delete_objects_locked(ns, ctx, older);
}

Status ChunkStore::delete_objects_locked(const std::string& ns, const std::string& ctx,
                                         std::span<const ObjectKey> keys) {
  if (keys.empty()) return {};
  // The files first (a crash between leaves an index rebuilt without them), then the
  // index; the directory's sync makes the unlinks durable.
  for (const ObjectKey& k : keys) KVS_RETURN_IF_ERROR(unlink_object(k));
  bool context_gone = false;
  {
    std::lock_guard lock(mu_);
    for (const ObjectKey& k : keys) {
      set_entry_locked(k, {});  // the quota's count, and the chunk and context once empty
      cache_drop_locked(k.name());
    }
    const auto n = index_.find(ns);
    context_gone = n == index_.end() || !n->second.contains(ctx);
  }
  // Its last objects: the directory (and the use mark in it) goes, as a remove's.
  return context_gone ? remove_context_dir(ns, ctx) : fsync_directory(context_dir(ns, ctx));
}

Status ChunkStore::unlink_object(const ObjectKey& k) {
  if (::unlink(object_path(k).c_str()) == 0 || errno == ENOENT) return {};
  const int err = errno;
  KVS_LOG_WARN("cannot remove '{}': {}", object_path(k), std::strerror(err));
  return make_status(StatusCode::io_error, "cannot remove object {}: {}", k.name(), std::strerror(err));
}

Status ChunkStore::remove_context_dir(const std::string& ns, const std::string& ctx) {
  // No write lands in a context directory except by a commit, which holds the
  // context's stripe (as the caller does): nothing appears in it while it goes.
  std::error_code ec;
  fs::remove_all(context_dir(ns, ctx), ec);
  if (ec) {
    KVS_LOG_WARN("cannot remove '{}': {}", context_dir(ns, ctx), ec.message());
    return make_status(StatusCode::io_error, "cannot remove context '{}': {}", ctx, ec.message());
  }
  return fsync_directory(dir_ + "/" + ns);
}

Result<uint64_t> ChunkStore::remove_object(const ObjectKey& k, uint64_t max_version) {
  KVS_RETURN_IF_ERROR(check_key(k));
  // The stripe keeps commits of this context out from the check to the directory's
  // sync: a write that lands after the check is the next commit, and stays.
  std::lock_guard stripe_lock(stripe(k.ns, k.ctx));
  uint64_t size = 0;
  {
    std::lock_guard lock(mu_);
    const Entry* e = entry_locked(k);
    if (!e || e->generation == 0) return make_status(StatusCode::not_found, "no object {}", k.name());
    if (e->version > max_version)
      return make_status(StatusCode::already_exists, "object {} holds a newer write (version {} > {})", k.name(),
                         e->version, max_version);
    size = e->size;
  }
  KVS_RETURN_IF_ERROR(delete_objects_locked(k.ns, k.ctx, std::span(&k, 1)));
  return size;
}

}  // namespace kvstream::storage

// ChunkStore::reencrypt: the pass that moves stored objects to the current at-rest key,
// after a rotation (a key appended to the key file) or when encryption is turned on
// over objects stored in clear. A rewrite is a commit like a put's (temporary file,
// fsync, rename under the context's stripe), but one that keeps the object's write
// version and parts table and loses to any write or remove that came after the read.
#include <chrono>
#include <thread>

#include "core/log.hpp"
#include "storage/node/chunk_store.hpp"
#include "storage/protocol.hpp"

namespace kvstream::storage {

using Clock = std::chrono::steady_clock;

namespace {
// An object is read and rewritten a piece at a time, so one large object holds one
// piece of the node's memory budget, not its whole size.
constexpr uint64_t kPieceBytes = kSegmentBytes;
}  // namespace

Result<ReencryptReport> ChunkStore::reencrypt(const ReencryptOptions& o) {
  const auto ring = keys();
  if (!ring) return make_status(StatusCode::invalid_argument, "re-encryption needs a key file");
  const uint32_t target = ring->current_id();
  struct Todo {
    ObjectKey key;
    uint64_t generation;
    uint32_t key_id;
  };
  std::vector<Todo> todo;
  {
    std::lock_guard lock(mu_);
    for (const auto& [ns, contexts] : index_)
      for (const auto& [ctx, c] : contexts)
        for (const auto& [chunk, levels] : c.chunks)
          for (uint32_t level = 0; level < levels.size(); ++level)
            if (levels[level].generation != 0 && levels[level].key_id != target)
              todo.push_back({ObjectKey{ns, ctx, chunk, level}, levels[level].generation, levels[level].key_id});
  }
  ReencryptReport report;
  if (todo.empty()) return report;
  // The piece buffer is held under the budget, beside the requests the node serves; a
  // full budget makes the pass wait, never a request fail.
  auto lease = budget_.acquire(kPieceBytes);
  while (!lease.ok() && !o.cancel.cancelled()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    lease = budget_.acquire(kPieceBytes);
  }
  if (!lease.ok()) {
    report.cancelled = true;
    report.remaining = objects_under_old_keys();
    return report;
  }
  std::vector<std::byte> buffer(kPieceBytes);
  const auto start = Clock::now();
  uint64_t paced = 0;
  // Sleeps until `bytes` more are due at the configured rate; false once cancelled.
  const std::function<bool(uint64_t)> pace = [&](uint64_t bytes) {
    paced += bytes;
    if (o.bytes_per_second != 0) {
      const auto due = start + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(double(paced) / double(o.bytes_per_second)));
      for (auto now = Clock::now(); now < due && !o.cancel.cancelled(); now = Clock::now())
        std::this_thread::sleep_for(std::min<Clock::duration>(due - now, std::chrono::milliseconds(50)));
    }
    return !o.cancel.cancelled();
  };
  for (const Todo& t : todo) {
    if (o.cancel.cancelled()) {
      report.cancelled = true;
      break;
    }
    if (t.key_id != 0 && !ring->has(t.key_id)) {
      ++report.missing_key;
      continue;
    }
    const Status s = reencrypt_one(t.key, t.generation, *ring, buffer, pace, o.committed, report);
    if (s.code() == StatusCode::cancelled) {
      report.cancelled = true;
      break;
    }
    if (!s.ok()) {
      ++report.failed;
      KVS_LOG_WARN("re-encryption of object {}: {}", t.key.name(), s.to_string());
    }
  }
  report.remaining = objects_under_old_keys();
  return report;
}

Status ChunkStore::reencrypt_one(const ObjectKey& k, uint64_t generation, const security::KeyRing& ring,
                                 std::span<std::byte> buffer, const std::function<bool(uint64_t)>& pace,
                                 std::atomic<uint64_t>* committed, ReencryptReport& report) {
  const std::string name = k.name(), path = object_path(k);
  // The version the index names, opened under the stripe as a get opens it.
  Result<ObjectFile> f = [&]() -> Result<ObjectFile> {
    std::lock_guard stripe_lock(stripe(k.ns, k.ctx));
    {
      std::lock_guard lock(mu_);
      const Entry* e = entry_locked(k);
      if (!e || e->generation != generation)
        return make_status(StatusCode::already_exists, "object {} was replaced", name);
    }
    auto opened = ObjectFile::open(path, name, &ring);
    if (!opened.ok() && opened.status().code() == StatusCode::corrupt_data) {
      std::lock_guard lock(mu_);
      quarantine_locked(k, path, opened.status().message());
    }
    return opened;
  }();
  if (!f.ok()) {
    switch (f.status().code()) {
      case StatusCode::already_exists:
      case StatusCode::not_found:
        ++report.replaced;
        return {};
      case StatusCode::permission_denied:
        ++report.missing_key;
        return {};
      default:
        return f.status();
    }
  }
  const ObjectHeader& h = f->header();
  KVS_ASSIGN_OR_RETURN(auto seal, new_object_seal(ring, k.ns));
  KVS_ASSIGN_OR_RETURN(auto tmp, TempObject::create(tmp_dir_, h.length, h.parts, std::move(seal), name));
  for (uint64_t at = 0; at < h.length; at += buffer.size()) {
    const auto piece = buffer.first(size_t(std::min<uint64_t>(buffer.size(), h.length - at)));
    if (Status s = f->read(at, piece); !s.ok()) {
      if (s.code() == StatusCode::corrupt_data) report_corrupt(k, *f);
      return s;
    }
    KVS_RETURN_IF_ERROR(tmp.append(piece));
    if (!pace(piece.size())) return make_status(StatusCode::cancelled, "re-encryption cancelled");
  }
  // The stored checksum is verified over what was read: a damaged object is moved
  // aside, never sealed again as if it were whole.
  if (Status s = tmp.finish(name, h.checksum, h.version); !s.ok()) {
    if (s.code() == StatusCode::corrupt_data) report_corrupt(k, *f);
    return s;
  }
  std::lock_guard stripe_lock(stripe(k.ns, k.ctx));
  bool held_at_fence = false;
  {
    std::lock_guard lock(mu_);
    const Entry* e = entry_locked(k);
    if (!e || e->generation != generation) {  // a write or remove since the read wins
      ++report.replaced;
      return {};
    }
    held_at_fence = e->held_at_fence;  // the same write: behind the fence if it was
  }
  KVS_RETURN_IF_ERROR(tmp.rename_to(path));
  {
    // The plaintext is the same, so a cached copy stays valid.
    std::lock_guard lock(mu_);
    if (committed) committed->fetch_add(1, std::memory_order_relaxed);
    set_entry_locked(k, Entry{h.length, next_generation_++, h.version, h.parts, tmp.key_id(), held_at_fence});
  }
  ++report.reencrypted;
  report.bytes += h.length;
  return fsync_directory(context_dir(k.ns, k.ctx));
}

}  // namespace kvstream::storage

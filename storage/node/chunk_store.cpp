#include "storage/node/chunk_store.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/log.hpp"
#include "storage/protocol.hpp"

namespace kvstream::storage {

namespace fs = std::filesystem;

namespace {
std::string file_name(uint32_t chunk, uint32_t level) { return fmt::format("c{}.l{}", chunk, level); }

// An object is read whole (and may be cached) when it is at most this share of the
// cache; larger ones stream, so one big object neither flushes the cache nor takes
// the budget whole.
constexpr uint64_t kCacheShare = 4;
}  // namespace

std::string ObjectKey::name() const { return fmt::format("{}/{}/{}", ns, ctx, file_name(chunk, level)); }

Result<std::unique_ptr<ChunkStore>> ChunkStore::open(const std::string& directory, uint64_t cache_bytes,
                                                     MemoryBudget& budget,
                                                     std::shared_ptr<const security::KeyRing> keys) {
  if (directory.empty()) return make_status(StatusCode::invalid_argument, "storage directory is not set");
  std::error_code ec;
  fs::create_directories(directory, ec);
  if (ec) return make_status(StatusCode::io_error, "cannot create '{}': {}", directory, ec.message());
  auto s = std::unique_ptr<ChunkStore>(new ChunkStore(budget));
  KVS_ASSIGN_OR_RETURN(s->lock_, DirLock::acquire(directory));
  s->dir_ = directory;
  s->tmp_dir_ = directory + "/.tmp";
  s->quarantine_dir_ = directory + "/.quarantine";
  s->cache_limit_ = cache_bytes;
  // The quotas charge whole allocation units; a file system that does not say (or
  // says something odd) is taken as 4 KiB.
  if (struct statvfs vfs {}; ::statvfs(directory.c_str(), &vfs) == 0 && vfs.f_frsize >= 512 && vfs.f_frsize <= (1u << 20))
    s->alloc_unit_ = vfs.f_frsize;
  // Temporary files are only ever half-written objects of a process that held the
  // lock and is gone: none can be completed, so they all go.
  if (fs::exists(s->tmp_dir_, ec)) {
    for (const auto& f : fs::directory_iterator(s->tmp_dir_, ec)) {
      fs::remove(f.path(), ec);
      ++s->counters_.stale_temporaries;
    }
  }
  fs::create_directories(s->tmp_dir_, ec);
  if (!ec) fs::create_directories(s->quarantine_dir_, ec);
  if (ec) return make_status(StatusCode::io_error, "cannot prepare '{}': {}", directory, ec.message());
  s->set_keys(std::move(keys));
  s->scan();
  KVS_RETURN_IF_ERROR(s->tombstones_.persist_to(s->dir_ + "/" + kRemovesFile));
  s->member_at_open_ = read_member_mark(s->dir_);
  budget.set_reclaimer([p = s.get()](uint64_t n) { p->reclaim(n); });
  if (s->counters_.stale_temporaries || s->counters_.quarantined)
    KVS_LOG_WARN("store '{}': removed {} temporary files of interrupted writes, moved {} damaged objects to {}",
                 directory, s->counters_.stale_temporaries, s->counters_.quarantined, s->quarantine_dir_);
  return s;
}

ChunkStore::~ChunkStore() { budget_.set_reclaimer(nullptr); }

// The index is the directory itself. Names that are not objects are skipped;
// temporaries of the older layout (<name>.tmp beside the object) are removed; objects
// whose header does not verify (truncated, damaged, copied under another name) are
// moved aside so that stat never reports them.
void ChunkStore::scan() {
  std::error_code ec;
  for (const auto& nsd : fs::directory_iterator(dir_, ec)) {
    const std::string ns = nsd.path().filename();
    if (!nsd.is_directory() || !validate_id(ns, kMaxNamespaceBytes, "namespace").ok()) continue;
    for (const auto& cd : fs::directory_iterator(nsd.path(), ec)) {
      const std::string ctx = cd.path().filename();
      if (!cd.is_directory() || !validate_id(ctx, kMaxContextBytes, "context").ok()) continue;
      for (const auto& f : fs::directory_iterator(cd.path(), ec)) {
        const std::string name = f.path().filename();
        if (name.size() > 4 && name.ends_with(".tmp")) {
          fs::remove(f.path(), ec);
          ++counters_.stale_temporaries;
          continue;
        }
        unsigned chunk = 0, level = 0;
        char tail = 0;
        if (std::sscanf(name.c_str(), "c%u.l%u%c", &chunk, &level, &tail) != 2 || level >= kMaxLevels ||
            chunk >= (1u << 20) || file_name(chunk, level) != name)
          continue;
        const ObjectKey k{ns, ctx, chunk, level};
        // An object sealed under a key the key file lacks is intact: it stays, indexed
        // by its verified structure, and is read once its key is back.
        auto obj = ObjectFile::open(f.path(), k.name(), keys().get(), KeyCheck::when_present);
        if (!obj.ok()) {
          quarantine_locked(k, f.path(), obj.status().message());
          continue;
        }
        set_entry_locked(k, Entry{obj->size(), next_generation_++, obj->header().version, obj->header().parts,
                                  obj->header().key_id, /*held_at_fence=*/true});
      }
      // The context's use mark, once it holds an object (a mark alone names nothing).
      if (auto n = index_.find(ns); n != index_.end())
        if (auto c = n->second.find(ctx); c != n->second.end())
          if (auto mark = read_use_mark(cd.path())) c->second.use = *mark;
    }
  }
}

std::mutex& ChunkStore::stripe(const std::string& ns, const std::string& ctx) {
  return stripes_[XXH3_64bits_withSeed(ctx.data(), ctx.size(), XXH3_64bits(ns.data(), ns.size())) % stripes_.size()];
}
std::string ChunkStore::context_dir(const std::string& ns, const std::string& ctx) const {
  return dir_ + "/" + ns + "/" + ctx;
}
std::string ChunkStore::object_path(const ObjectKey& k) const {
  return context_dir(k.ns, k.ctx) + "/" + file_name(k.chunk, k.level);
}

Status ChunkStore::check_key(const ObjectKey& k) {
  KVS_RETURN_IF_ERROR(validate_id(k.ns, kMaxNamespaceBytes, "namespace"));
  KVS_RETURN_IF_ERROR(validate_id(k.ctx, kMaxContextBytes, "context id"));
  if (k.level >= kMaxLevels) return make_status(StatusCode::out_of_range, "level {} (limit {})", k.level, kMaxLevels);
  return {};
}

uint64_t ChunkStore::disk_charge(uint64_t length, size_t parts, bool sealed) const {
  const uint64_t file = (sealed ? kSealedObjectHeaderBytes : kObjectHeaderBytes) + 16 * parts +
                        (sealed ? sealed_bytes(length, kSealBlockBytes) : length);
  return (file + alloc_unit_ - 1) / alloc_unit_ * alloc_unit_;
}

ChunkStore::Entry* ChunkStore::entry_locked(const ObjectKey& k) {
  auto n = index_.find(k.ns);
  if (n == index_.end()) return nullptr;
  auto c = n->second.find(k.ctx);
  if (c == n->second.end()) return nullptr;
  auto ch = c->second.chunks.find(k.chunk);
  if (ch == c->second.chunks.end() || ch->second.size() <= k.level) return nullptr;
  Entry& e = ch->second[k.level];
  return e.generation ? &e : nullptr;
}

void ChunkStore::set_entry_locked(const ObjectKey& k, Entry e) {
  const Entry* old = entry_locked(k);
  quota_.stored(k.ns, old ? disk_charge(*old) : 0, e.generation ? disk_charge(e) : 0);
  if (old && old->key_id != current_key_id_) --under_old_keys_;
  if (e.generation != 0 && e.key_id != current_key_id_) ++under_old_keys_;
  if (e.generation == 0) {  // absent: drop it, and the chunk and context once empty
    auto n = index_.find(k.ns);
    if (n == index_.end()) return;
    auto c = n->second.find(k.ctx);
    if (c == n->second.end()) return;
    auto ch = c->second.chunks.find(k.chunk);
    if (ch == c->second.chunks.end() || ch->second.size() <= k.level) return;
    ch->second[k.level] = {};
    while (!ch->second.empty() && ch->second.back().generation == 0) ch->second.pop_back();
    if (ch->second.empty()) c->second.chunks.erase(ch);
    if (c->second.chunks.empty()) {
      n->second.erase(c);
      quota_.stored(k.ns, context_charge(), 0);
    }
    return;
  }
  const auto [ctx, made] = index_[k.ns].try_emplace(k.ctx);
  if (made) quota_.stored(k.ns, 0, context_charge());
  auto& v = ctx->second.chunks[k.chunk];
  if (v.size() <= k.level) v.resize(k.level + 1);
  v[k.level] = e;
}

void ChunkStore::quarantine_locked(const ObjectKey& k, const std::string& path, std::string_view why) {
  const std::string to =
      fmt::format("{}/{}.{}.{}.{}", quarantine_dir_, k.ns, k.ctx, file_name(k.chunk, k.level), next_generation_++);
  if (std::rename(path.c_str(), to.c_str()) != 0)
    KVS_LOG_WARN("cannot move damaged object '{}' aside: {}", path, std::strerror(errno));
  else
    KVS_LOG_WARN("object {} is damaged ({}): moved to '{}'", k.name(), why, to);
  ++counters_.quarantined;
  set_entry_locked(k, {});
  cache_drop_locked(k.name());
}

Result<ChunkStore::PendingPut> ChunkStore::begin_put(ObjectKey key, uint64_t length, uint64_t version,
                                                     std::vector<ObjectPart> parts) {
  KVS_RETURN_IF_ERROR(check_key(key));
  if (length > kMaxChunkBytes)
    return make_status(StatusCode::out_of_range, "{} bytes (limit {})", length, kMaxChunkBytes);
  KVS_RETURN_IF_ERROR(validate_parts(parts, length));
  std::optional<ObjectSeal> seal;
  if (const auto ring = keys()) {
    KVS_ASSIGN_OR_RETURN(seal, new_object_seal(*ring, key.ns));
  }
  PendingPut p;
  {
    std::lock_guard lock(mu_);
    const Entry* e = entry_locked(key);
    // A put that makes a context is charged its directory and mark file too.
    const auto n = index_.find(key.ns);
    const bool new_context = n == index_.end() || !n->second.contains(key.ctx);
    const uint64_t charge = disk_charge(length, parts.size(), seal.has_value()) + (new_context ? context_charge() : 0);
    KVS_RETURN_IF_ERROR(quota_.reserve(key.ns, charge, e ? disk_charge(*e) : 0));
    p.claim_ = QuotaClaim(this, key.ns, charge);
  }
  KVS_ASSIGN_OR_RETURN(p.tmp_, TempObject::create(tmp_dir_, length, std::move(parts), std::move(seal), key.name()));
  p.key_ = std::move(key);
  p.version_ = version;
  return p;
}

Status ChunkStore::commit(PendingPut&& pending, uint64_t checksum) {
  PendingPut p = std::move(pending);  // a refused put's temporary file goes with it
  const ObjectKey& k = p.key_;
  // The file's sync happens outside the context's lock; only an unversioned write,
  // whose version follows the stored one, has to learn it first.
  const bool unversioned = p.version_ == 0;
  if (!unversioned) KVS_RETURN_IF_ERROR(p.tmp_.finish(k.name(), checksum, p.version_));
  std::lock_guard stripe_lock(stripe(k.ns, k.ctx));
  uint64_t stored = 0;
  {
    std::lock_guard lock(mu_);
    if (const Entry* e = entry_locked(k)) stored = e->version;
  }
  const uint64_t removed = tombstones_.removed_up_to(k.ns, k.ctx);
  if (unversioned) {
    p.version_ = std::max(stored, removed) + 1;
    KVS_RETURN_IF_ERROR(p.tmp_.finish(k.name(), checksum, p.version_));
  }
  if (p.version_ <= stored)
    return make_status(StatusCode::already_exists, "object {} holds a newer write (version {} >= {})", k.name(),
                       stored, p.version_);
  // A copy of a write the context's remove covered (one that crossed the remove, or
  // a rebalance from a node that was away) would bring the removed context back.
  if (p.version_ <= removed)
    return make_status(StatusCode::already_exists, "context {}/{} was removed up to version {} (this write: {})",
                       k.ns, k.ctx, removed, p.version_);
  const std::string ns_dir = dir_ + "/" + k.ns, ctx_dir = context_dir(k.ns, k.ctx);
  std::error_code ec;
  // A new directory's entry in its parent must be durable too.
  const bool new_ns = !fs::exists(ns_dir, ec);
  const bool new_ctx = new_ns || !fs::exists(ctx_dir, ec);
  if (new_ctx) {
    fs::create_directories(ctx_dir, ec);
    if (ec) {
      KVS_LOG_WARN("cannot create '{}': {}", ctx_dir, ec.message());
      return make_status(StatusCode::io_error, "cannot create context {}/{}: {}", k.ns, k.ctx, ec.message());
    }
    if (new_ns) KVS_RETURN_IF_ERROR(fsync_directory(dir_));
    KVS_RETURN_IF_ERROR(fsync_directory(ns_dir));
  }
  KVS_RETURN_IF_ERROR(p.tmp_.rename_to(object_path(k)));
  // Visible from here on: the index and the cache follow before the lock is dropped,
  // and the acknowledgement waits for the directory's sync.
  {
    std::lock_guard lock(mu_);
    set_entry_locked(k, Entry{p.tmp_.written(), next_generation_++, p.version_, p.tmp_.parts(), p.tmp_.key_id()});
    // In the same step as the index counts the bytes: a concurrent put's check sees
    // them once.
    end_claim_locked(p.claim_);
    cache_drop_locked(k.name());
  }
  return fsync_directory(ctx_dir);
}

Status ChunkStore::put(const ObjectKey& key, std::span<const std::byte> bytes, uint64_t version,
                       std::vector<ObjectPart> parts) {
  KVS_ASSIGN_OR_RETURN(auto p, begin_put(key, bytes.size(), version, std::move(parts)));
  KVS_RETURN_IF_ERROR(p.append(bytes));
  return commit(std::move(p), XXH3_64bits(bytes.data(), bytes.size()));
}

Result<ObjectRead> ChunkStore::get(const ObjectKey& k) {
  KVS_RETURN_IF_ERROR(check_key(k));
  const std::string key = k.name();
  {
    std::lock_guard lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      const Bytes& b = it->second->second;
      ObjectRead r;
      r.bytes = b, r.size = b->data.size(), r.checksum = b->checksum, r.cache_hit = true;
      return r;
    }
  }
  ObjectRead r;
  uint64_t generation = 0;
  {
    std::lock_guard stripe_lock(stripe(k.ns, k.ctx));
    // The stripe keeps commits out until the file is open, so the generation read
    // here is the one the descriptor below opens.
    {
      std::lock_guard lock(mu_);
      if (const Entry* e = entry_locked(k)) {
        if (fenced_locked(*e)) {
          fenced_gets_.fetch_add(1, std::memory_order_relaxed);
          return make_status(StatusCode::not_found,
                             "object {} was stored before this node came back, and is not served until its "
                             "cluster has handed it the removes made meanwhile",
                             key);
        }
        generation = e->generation;
      }
    }
    const std::string path = object_path(k);
    auto f = ObjectFile::open(path, key, keys().get());
    if (!f.ok()) {
      if (f.status().code() == StatusCode::corrupt_data) {
        std::lock_guard lock(mu_);
        quarantine_locked(k, path, f.status().message());
      }
      return f.status();
    }
    r.file = std::move(f).value();
  }
  r.size = r.file.size(), r.checksum = r.file.header().checksum;
  if (cache_limit_ == 0 || r.size > cache_limit_ / kCacheShare) return r;
  // Small enough to read whole and cache, if the budget has room; else it streams.
  auto lease = budget_.acquire(r.size);
  if (!lease.ok()) return r;
  std::shared_ptr<Blob> blob;
  try {
    blob = std::make_shared<Blob>();
    blob->data.resize(r.size);
  } catch (const std::bad_alloc&) {
    return r;
  }
  if (Status s = r.file.read(0, blob->data); !s.ok()) {
    if (s.code() == StatusCode::corrupt_data) report_corrupt(k, r.file);  // a sealed block failed its tag
    return s;
  }
  blob->checksum = XXH3_64bits(blob->data.data(), blob->data.size());
  if (blob->checksum != r.checksum) {
    report_corrupt(k, r.file);
    return make_status(StatusCode::corrupt_data, "object {} failed its checksum on disk", key);
  }
  blob->lease = std::move(lease).value();
  {
    std::lock_guard lock(mu_);
    // Only the version the index still names goes into the cache: a commit since the
    // open made this one stale. Nor one fenced since (ChunkStore::rejoin).
    const Entry* e = entry_locked(k);
    if (e && generation != 0 && e->generation == generation && !fenced_locked(*e)) cache_put_locked(key, blob);
  }
  r.bytes = std::move(blob);
  r.file = ObjectFile();
  return r;
}

Result<std::vector<std::byte>> ChunkStore::read_all(const ObjectKey& k) {
  KVS_ASSIGN_OR_RETURN(auto stored, read_stored(k));
  return std::move(stored.bytes);
}

Result<ChunkStore::StoredObject> ChunkStore::read_stored(const ObjectKey& k) {
  KVS_RETURN_IF_ERROR(check_key(k));
  Result<ObjectFile> f = [&] {
    std::lock_guard stripe_lock(stripe(k.ns, k.ctx));
    return ObjectFile::open(object_path(k), k.name(), keys().get());
  }();
  KVS_RETURN_IF_ERROR(f.status());
  StoredObject out;
  out.version = f->header().version;
  out.parts = f->header().parts;
  out.bytes.resize(f->size());
  if (Status s = f->read(0, out.bytes); !s.ok()) {
    if (s.code() == StatusCode::corrupt_data) report_corrupt(k, *f);
    return s;
  }
  if (XXH3_64bits(out.bytes.data(), out.bytes.size()) != f->header().checksum) {
    report_corrupt(k, *f);
    return make_status(StatusCode::corrupt_data, "object {} failed its checksum on disk", k.name());
  }
  return out;
}

void ChunkStore::report_corrupt(const ObjectKey& k, const ObjectFile& file) {
  std::lock_guard stripe_lock(stripe(k.ns, k.ctx));
  const std::string path = object_path(k);
  struct stat st {};
  std::lock_guard lock(mu_);
  if (::stat(path.c_str(), &st) == 0 && std::pair<uint64_t, uint64_t>(st.st_dev, st.st_ino) == file.identity())
    quarantine_locked(k, path, "payload checksum");
  else
    cache_drop_locked(k.name());  // a newer version replaced it already
}

Result<std::vector<ChunkStat>> ChunkStore::stat(const std::string& ns, const std::string& ctx, bool hide_fenced) {
  std::lock_guard lock(mu_);
  auto n = index_.find(ns);
  if (n == index_.end()) return make_status(StatusCode::not_found, "no context '{}'", ctx);
  auto c = n->second.find(ctx);
  if (c == n->second.end()) return make_status(StatusCode::not_found, "no context '{}'", ctx);
  std::vector<ChunkStat> out;
  for (const auto& [chunk, levels] : c->second.chunks) {
    ChunkStat s{chunk, {}, {}};
    size_t served = 0;  // levels up to the last one served
    for (size_t l = 0; l < levels.size(); ++l) {
      const Entry& e = levels[l];
      if (hide_fenced && fenced_locked(e)) {
        s.level_bytes.push_back(0), s.level_parts.emplace_back(), s.level_versions.push_back(0);
        continue;
      }
      if (e.generation != 0) served = l + 1;
      s.level_bytes.push_back(e.size), s.level_parts.push_back(e.parts), s.level_versions.push_back(e.version);
    }
    if (hide_fenced) {  // as if the fenced levels were not there
      if (served == 0) continue;
      s.level_bytes.resize(served), s.level_parts.resize(served), s.level_versions.resize(served);
    }
    trim_level_parts(s.level_parts);
    out.push_back(std::move(s));
  }
  if (out.empty()) return make_status(StatusCode::not_found, "no context '{}'", ctx);  // all fenced
  return out;
}

std::vector<std::string> ChunkStore::list(const std::string& ns, bool hide_fenced) {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  if (auto n = index_.find(ns); n != index_.end())
    for (const auto& [ctx, c] : n->second)
      if (!hide_fenced || served_locked(c)) out.push_back(ctx);
  return out;
}

bool ChunkStore::served_locked(const Context& c) const {
  for (const auto& [chunk, levels] : c.chunks)
    for (const Entry& e : levels)
      if (e.generation != 0 && !fenced_locked(e)) return true;
  return false;
}

void ChunkStore::set_keys(std::shared_ptr<const security::KeyRing> keys) {
  const uint32_t current = keys ? keys->current_id() : 0;
  {
    std::lock_guard lock(keys_mu_);
    keys_ = std::move(keys);
  }
  std::lock_guard lock(mu_);
  current_key_id_ = current;
  under_old_keys_ = 0;
  for (const auto& [ns, contexts] : index_)
    for (const auto& [ctx, c] : contexts)
      for (const auto& [chunk, levels] : c.chunks)
        for (const Entry& e : levels) under_old_keys_ += e.generation != 0 && e.key_id != current;
}

std::shared_ptr<const security::KeyRing> ChunkStore::keys() const {
  std::lock_guard lock(keys_mu_);
  return keys_;
}

uint64_t ChunkStore::objects_under_old_keys() const {
  std::lock_guard lock(mu_);
  return under_old_keys_;
}

}  // namespace kvstream::storage

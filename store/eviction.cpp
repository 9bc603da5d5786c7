#include "store/eviction.hpp"

#include <algorithm>

#include "core/log.hpp"

namespace kvstream::store {

namespace {

// A chunk's record into `slot` of the record buffer; nullopt when it has none (a put
// cut short, or removed meanwhile) or it does not parse.
std::optional<ChunkRecord> read_record(KvStore::Impl& m, const std::string& key, size_t slot,
                                       transport::Deadline deadline) {
  const size_t at = slot * kChunkRecordBytes;
  auto got = m.client->get(key, kRecordChunk, 0, m.record_region, at, kChunkRecordBytes, deadline);
  if (!got.ok()) return std::nullopt;
  auto rec = parse_chunk_record(std::span(m.record_buf).subspan(at, *got));
  if (!rec.ok()) return std::nullopt;
  return *rec;
}

// What an unmarked chunk's record says of it.
void take_record(KvStore::Impl& m, StoredChunk& e, const std::optional<ChunkRecord>& rec) {
  e.has_record = rec.has_value();
  if (!rec) return;
  e.last_used_us = rec->stored_unix_ms * 1000;
  e.depth = rec->first_position / m.keyer.chunk_tokens();
}

// Fills in the records of `chunks` (those for which `wanted`), kParallelStats at a
// time side by side, as a lookup's stats: a store of thousands of chunks is read in a
// fraction of the time one after another takes. Slot i of the record buffer is read i's.
template <typename Wanted>
void read_records(KvStore::Impl& m, std::vector<StoredChunk>& chunks, const Wanted& wanted,
                  transport::Deadline deadline) {
  std::vector<StoredChunk*> todo;
  for (StoredChunk& c : chunks)
    if (wanted(c)) todo.push_back(&c);
  std::lock_guard lk(m.record_mu);
  for (size_t first = 0; first < todo.size(); first += KvStore::Impl::kParallelStats) {
    std::vector<std::optional<std::optional<ChunkRecord>>> got(
        std::min(KvStore::Impl::kParallelStats, todo.size() - first));
    KvStore::Impl::read_side_by_side(got, [&](size_t i) { return read_record(m, todo[first + i]->key, i, deadline); });
    for (size_t i = 0; i < got.size(); ++i) take_record(m, *todo[first + i], *got[i]);
  }
}

// Without a usage listing: list, then a stat (the sizes) and a record each. A chunk
// removed between the list and its stat is left out.
Result<std::vector<StoredChunk>> read_without_usage(KvStore::Impl& m, transport::Deadline deadline) {
  KVS_ASSIGN_OR_RETURN(auto contexts, m.client->list(deadline));
  std::vector<std::string> keys;
  for (auto& key : contexts)
    if (key.rfind(m.keyer.prefix(), 0) == 0) keys.push_back(std::move(key));  // this model's and profile's
  std::vector<StoredChunk> out;
  for (size_t first = 0; first < keys.size(); first += KvStore::Impl::kParallelStats) {
    std::vector<std::optional<Result<std::optional<StoredChunk>>>> got(
        std::min(KvStore::Impl::kParallelStats, keys.size() - first));
    KvStore::Impl::read_side_by_side(got, [&](size_t i) -> Result<std::optional<StoredChunk>> {
      auto stats = m.client->stat(keys[first + i], deadline);
      if (!stats.ok()) {
        if (stats.status().code() == StatusCode::not_found) return std::optional<StoredChunk>();
        return stats.status();
      }
      StoredChunk e;
      e.key = keys[first + i];
      for (const auto& s : *stats)
        for (uint64_t b : s.level_bytes) e.bytes += b;
      return std::optional<StoredChunk>(std::move(e));
    });
    for (auto& g : got) {
      if (!g->ok()) return g->status();
      if (**g) out.push_back(std::move(***g));
    }
  }
  read_records(m, out, [](const StoredChunk&) { return true; }, deadline);
  return out;
}

// From a usage listing: only the unmarked need their records (their depth and time).
// nullopt where the storage lists no usage (unsupported).
Result<std::optional<std::vector<StoredChunk>>> read_with_usage(KvStore::Impl& m, transport::Deadline deadline) {
  auto usage = m.client->usage(m.keyer.prefix(), deadline);
  if (!usage.ok()) {
    if (usage.status().code() == StatusCode::unsupported) return std::optional<std::vector<StoredChunk>>();
    return usage.status();
  }
  std::vector<StoredChunk> out;
  for (storage::ContextUsage& u : *usage) {
    StoredChunk e;
    e.key = std::move(u.context);
    e.bytes = u.bytes;
    e.has_record = std::binary_search(u.chunks.begin(), u.chunks.end(), kRecordChunk);
    e.marked = u.used != 0;
    e.last_used_us = u.used;  // microseconds (next_write_version): two marks a moment apart still order
    e.depth = u.depth;
    out.push_back(std::move(e));
  }
  read_records(m, out, [](const StoredChunk& c) { return !c.marked && c.has_record; }, deadline);
  return std::optional(std::move(out));
}

}  // namespace

Result<std::vector<StoredChunk>> chunks_in_eviction_order(KvStore::Impl& m, transport::Deadline deadline) {
  std::optional<std::vector<StoredChunk>> listed;
  if (m.cfg.eviction.by_use) {
    KVS_ASSIGN_OR_RETURN(listed, read_with_usage(m, deadline));
  }
  if (!listed) {
    KVS_ASSIGN_OR_RETURN(listed, read_without_usage(m, deadline));
  }
  std::vector<StoredChunk>& out = *listed;
  std::sort(out.begin(), out.end(), [](const StoredChunk& a, const StoredChunk& b) {
    if (a.has_record != b.has_record) return a.has_record;
    if (a.marked != b.marked) return !a.marked;
    if (!a.marked && a.depth != b.depth) return a.depth > b.depth;
    if (a.last_used_us != b.last_used_us) return a.last_used_us < b.last_used_us;
    if (a.depth != b.depth) return a.depth > b.depth;
    return a.key < b.key;
  });
  return out;
}

Status remove_chunk(KvStore::Impl& m, const StoredChunk& chunk, transport::Deadline deadline) {
  m.forget(chunk.key);
  const Status st = m.client->remove(chunk.key, deadline);
  return st.code() == StatusCode::not_found ? Status() : st;
}

Result<EvictReport> make_room(KvStore::Impl& m, uint64_t bytes, double fraction,
                              const std::unordered_set<std::string>& keep, transport::Deadline deadline) {
  KVS_ASSIGN_OR_RETURN(auto chunks, chunks_in_eviction_order(m, deadline));
  uint64_t total = 0;
  for (const StoredChunk& c : chunks) total += c.bytes;
  bytes = std::max(bytes, uint64_t(std::clamp(fraction, 0.0, 1.0) * double(total)));
  EvictReport r;
  for (const StoredChunk& c : chunks) {
    if (keep.contains(c.key) || !c.has_record) {
      r.bytes_kept += c.bytes;
      continue;
    }
    if (r.bytes_removed >= bytes) {
      r.bytes_kept += c.bytes;
      continue;
    }
    KVS_RETURN_IF_ERROR(remove_chunk(m, c, deadline));
    ++r.chunks_removed;
    r.bytes_removed += c.bytes;
  }
  // At debug: a full store does this every so many puts (PutReport counts it).
  KVS_LOG_DEBUG("kvstore: the storage had no space for a put: evicted {} chunks ({} bytes) of {} wanted; {} bytes kept",
                r.chunks_removed, r.bytes_removed, bytes, r.bytes_kept);
  return r;
}

}  // namespace kvstream::store

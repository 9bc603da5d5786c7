#include "store/eviction.hpp"

#include <algorithm>

#include "core/log.hpp"

namespace kvstream::store {

namespace {

// One chunk's size, position and time: a stat and a read of its record into `slot`
// of the record buffer. nullopt: removed meanwhile.
Result<std::optional<StoredChunk>> read_chunk(KvStore::Impl& m, std::string key, size_t slot,
                                              transport::Deadline deadline) {
  auto stats = m.client->stat(key, deadline);
  if (!stats.ok()) {
    if (stats.status().code() == StatusCode::not_found) return std::optional<StoredChunk>();
    return stats.status();
  }
  StoredChunk e{std::move(key), 0, false, 0, 0};
  for (const auto& s : *stats)
    for (uint64_t b : s.level_bytes) e.bytes += b;
  const size_t at = slot * kChunkRecordBytes;
  auto got = m.client->get(e.key, kRecordChunk, 0, m.record_region, at, kChunkRecordBytes, deadline);
  if (got.ok())
    if (auto rec = parse_chunk_record(std::span(m.record_buf).subspan(at, *got)); rec.ok()) {
      e.has_record = true;
      e.stored_ms = rec->stored_unix_ms;
      e.position = rec->first_position;
    }
  return std::optional<StoredChunk>(std::move(e));
}

}  // namespace

Result<std::vector<StoredChunk>> chunks_in_eviction_order(KvStore::Impl& m, transport::Deadline deadline) {
  KVS_ASSIGN_OR_RETURN(auto contexts, m.client->list(deadline));
  std::vector<std::string> keys;
  for (auto& key : contexts)
    if (key.rfind(m.keyer.prefix(), 0) == 0) keys.push_back(std::move(key));  // this model's and profile's
  std::vector<StoredChunk> out;
  std::lock_guard lk(m.record_mu);
  // Side by side, as a lookup's stats: two round trips a chunk, so a store of
  // thousands of chunks is read in a fraction of the time one after another takes.
  // Slot i of the record buffer is read i's.
  for (size_t first = 0; first < keys.size(); first += KvStore::Impl::kParallelStats) {
    std::vector<std::optional<Result<std::optional<StoredChunk>>>> got(
        std::min(KvStore::Impl::kParallelStats, keys.size() - first));
    KvStore::Impl::read_side_by_side(got, [&](size_t i) { return read_chunk(m, keys[first + i], i, deadline); });
    for (auto& g : got) {
      if (!g->ok()) return g->status();
      if (**g) out.push_back(std::move(***g));
    }
  }
  std::sort(out.begin(), out.end(), [](const StoredChunk& a, const StoredChunk& b) {
    if (a.has_record != b.has_record) return a.has_record;
    return a.position != b.position ? a.position > b.position : a.stored_ms < b.stored_ms;
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

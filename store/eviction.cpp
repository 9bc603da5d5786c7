#include "store/eviction.hpp"

#include <algorithm>

#include "core/log.hpp"

namespace kvstream::store {

Result<std::vector<StoredChunk>> chunks_in_eviction_order(KvStore::Impl& m, transport::Deadline deadline) {
  KVS_ASSIGN_OR_RETURN(auto contexts, m.client->list(deadline));
  std::vector<StoredChunk> out;
  for (auto& key : contexts) {
    if (key.rfind(m.keyer.prefix(), 0) != 0) continue;  // another model's or profile's
    auto stats = m.client->stat(key, deadline);
    if (!stats.ok()) {
      if (stats.status().code() == StatusCode::not_found) continue;  // removed meanwhile
      return stats.status();
    }
    StoredChunk e{std::move(key), 0, false, 0, 0};
    for (const auto& s : *stats)
      for (uint64_t b : s.level_bytes) e.bytes += b;
    std::lock_guard lk(m.record_mu);
    auto got = m.client->get(e.key, kRecordChunk, 0, m.record_region, 0, m.record_buf.size(), deadline);
    if (got.ok())
      if (auto rec = parse_chunk_record(std::span(m.record_buf).first(*got)); rec.ok()) {
        e.has_record = true;
        e.stored_ms = rec->stored_unix_ms;
        e.position = rec->first_position;
      }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const StoredChunk& a, const StoredChunk& b) {
    if (a.has_record != b.has_record) return !a.has_record;
    return a.position != b.position ? a.position > b.position : a.stored_ms < b.stored_ms;
  });
  return out;
}

Status remove_chunk(KvStore::Impl& m, const StoredChunk& chunk, transport::Deadline deadline) {
  m.forget(chunk.key);
  const Status st = m.client->remove(chunk.key, deadline);
  return st.code() == StatusCode::not_found ? Status() : st;
}

Result<EvictReport> make_room(KvStore::Impl& m, uint64_t bytes, const std::unordered_set<std::string>& keep,
                              transport::Deadline deadline) {
  KVS_ASSIGN_OR_RETURN(auto chunks, chunks_in_eviction_order(m, deadline));
  EvictReport r;
  for (const StoredChunk& c : chunks) {
    if (keep.contains(c.key)) {
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
  KVS_LOG_INFO("kvstore: the storage had no space for a put: evicted {} chunks ({} bytes) of {} wanted; {} bytes kept",
               r.chunks_removed, r.bytes_removed, bytes, r.bytes_kept);
  return r;
}

}  // namespace kvstream::store

// Where a fetch's ranges are stored and how large each level of them is: the stored
// object of range i (FetchRequest::stored_contexts, stored_chunks) and its level sizes,
// read by stat (a progressive chunk's from its parts table: levels are prefixes of
// one object). Used by the pipeline, the refinement and the store's fetch.
#include <map>

#include "kvstream/pipeline.hpp"

namespace kvstream::pipeline {

const std::string& stored_context(const FetchRequest& r, size_t i) {
  return r.stored_contexts.empty() ? r.context : r.stored_contexts[i];
}
uint32_t stored_chunk(const FetchRequest& r, size_t i) {
  return r.stored_chunks.empty() ? uint32_t(i) : r.stored_chunks[i];
}

std::vector<uint64_t> stored_level_bytes(const storage::ChunkStat& stat, bool progressive) {
  if (!progressive) return stat.level_bytes;
  if (stat.level_parts.empty() || stat.level_parts[0].empty()) return {};
  const std::vector<storage::ObjectPart>& parts = stat.level_parts[0];
  std::vector<uint64_t> sizes(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) sizes[i] = parts[parts.size() - 1 - i].end;
  return sizes;
}

Result<std::vector<std::vector<uint64_t>>> range_level_bytes(storage::Client& client, const FetchRequest& req,
                                                            bool progressive) {
  if (!req.level_bytes.empty()) return req.level_bytes;
  std::vector<std::vector<uint64_t>> sizes(req.chunks.size());
  // One stat per context, however many ranges come from it.
  std::map<std::string, std::map<uint32_t, std::vector<uint64_t>>> by_context;
  for (size_t i = 0; i < req.chunks.size(); ++i) {
    const std::string& ctx = stored_context(req, i);
    auto it = by_context.find(ctx);
    if (it == by_context.end()) {
      KVS_ASSIGN_OR_RETURN(auto stats, client.stat(ctx, req.deadline, req.cancel));
      it = by_context.emplace(ctx, std::map<uint32_t, std::vector<uint64_t>>{}).first;
      for (auto& st : stats) it->second[st.chunk] = stored_level_bytes(st, progressive);
    }
    if (auto c = it->second.find(stored_chunk(req, i)); c != it->second.end()) sizes[i] = c->second;
  }
  return sizes;
}

}  // namespace kvstream::pipeline

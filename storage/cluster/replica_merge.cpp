// Merging the nodes' answers of the same data (replica_merge.hpp).
#include "storage/cluster/replica_merge.hpp"

#include <algorithm>
#include <iterator>
#include <map>

#include "core/log.hpp"
#include "storage/protocol.hpp"

namespace kvstream::cluster {

using storage::ChunkStat;
using storage::ContextUsage;

std::vector<ChunkStat> merge_stats(const std::string& context, std::vector<std::vector<ChunkStat>> answers) {
  std::map<uint32_t, ChunkStat> merged;
  for (auto& r : answers)
    for (ChunkStat& s : r) {
      ChunkStat& m = merged[s.chunk];
      m.chunk = s.chunk;
      auto& v = m.level_bytes;
      if (v.size() < s.level_bytes.size()) v.resize(s.level_bytes.size(), 0);
      if (m.level_parts.size() < s.level_bytes.size()) m.level_parts.resize(s.level_bytes.size());
      for (size_t l = 0; l < s.level_bytes.size(); ++l) {
        auto parts = l < s.level_parts.size() ? std::move(s.level_parts[l]) : std::vector<storage::ObjectPart>();
        if (v[l] != 0 && s.level_bytes[l] != 0 && (v[l] != s.level_bytes[l] || m.level_parts[l] != parts))
          KVS_LOG_WARN("cluster: replicas of chunk {} level {} of '{}' differ ({} and {} bytes, {} and {} parts)",
                       s.chunk, l, context, v[l], s.level_bytes[l], m.level_parts[l].size(), parts.size());
        if (s.level_bytes[l] > v[l]) v[l] = s.level_bytes[l], m.level_parts[l] = std::move(parts);
      }
      if (!s.level_versions.empty()) {
        auto& mv = m.level_versions;
        if (mv.size() < s.level_versions.size()) mv.resize(s.level_versions.size(), 0);
        for (size_t l = 0; l < s.level_versions.size(); ++l) mv[l] = std::max(mv[l], s.level_versions[l]);
      }
    }
  std::vector<ChunkStat> out;
  out.reserve(merged.size());
  for (auto& [chunk, s] : merged) {
    storage::trim_level_parts(s.level_parts);
    if (!s.level_versions.empty()) s.level_versions.resize(s.level_bytes.size(), 0);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<ContextUsage> merge_usage(std::vector<std::vector<ContextUsage>> answers) {
  std::map<std::string, ContextUsage> merged;
  for (auto& v : answers)
    for (ContextUsage& u : v) {
      auto [it, fresh] = merged.try_emplace(u.context, u);
      if (fresh) continue;
      ContextUsage& m = it->second;
      m.bytes = std::max(m.bytes, u.bytes);
      m.written = std::max(m.written, u.written);
      if (u.used > m.used) m.used = u.used, m.depth = u.depth;
      std::vector<uint32_t> chunks;
      std::set_union(m.chunks.begin(), m.chunks.end(), u.chunks.begin(), u.chunks.end(), std::back_inserter(chunks));
      m.chunks = std::move(chunks);
    }
  std::vector<ContextUsage> out;
  out.reserve(merged.size());
  for (auto& [name, u] : merged) out.push_back(std::move(u));
  return out;
}

}  // namespace kvstream::cluster

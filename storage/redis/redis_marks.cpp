#include "storage/redis/redis_marks.hpp"

#include <cstdio>

#include "storage/protocol.hpp"
#include "storage/redis/redis_calls.hpp"
#include "storage/redis/redis_conn.hpp"

namespace kvstream::redis::detail {

namespace {
// Lua numbers are doubles: stamps (us since the epoch, about 1.8e15) stay exact below 2^53.
constexpr uint64_t kMaxLuaExact = uint64_t(1) << 53;
// KEYS[1] the marks hash, KEYS[2] the contexts set; ARGV[1] the stamp, then each
// context and its depth.
constexpr const char* kTouchScript =
    "local stamp = tonumber(ARGV[1]) "
    "for i = 2, #ARGV, 2 do "
    "  if redis.call('SISMEMBER', KEYS[2], ARGV[i]) == 1 then "
    "    local cur = redis.call('HGET', KEYS[1], ARGV[i]) "
    "    local s = cur and tonumber(string.match(cur, '^(%d+)')) or -1 "
    "    if stamp >= s then redis.call('HSET', KEYS[1], ARGV[i], ARGV[1] .. ' ' .. ARGV[i + 1]) end "
    "  end "
    "end "
    "return 0";
}  // namespace

Result<std::vector<std::string>> touch_command(const std::string& marks_key, const std::string& contexts_key,
                                               std::span<const storage::ContextTouch> contexts, uint64_t stamp) {
  for (const auto& t : contexts)
    KVS_RETURN_IF_ERROR(storage::validate_id(t.context, storage::kMaxContextBytes, "context id"));
  if (stamp == 0) stamp = storage::next_write_version();
  if (stamp >= kMaxLuaExact)
    return make_status(StatusCode::invalid_argument, "a use stamp at or above 2^53 (Redis keeps marks as Lua numbers)");
  if (contexts.empty()) return std::vector<std::string>();
  std::vector<std::string> argv{"EVAL", kTouchScript, "2", marks_key, contexts_key, std::to_string(stamp)};
  for (const auto& t : contexts) argv.push_back(t.context), argv.push_back(std::to_string(t.depth));
  return argv;
}

Result<std::map<std::string, storage::ContextUsage>> listed_with_marks(const redisReply* members,
                                                                       const redisReply* marks,
                                                                       const std::string& prefix) {
  KVS_ASSIGN_OR_RETURN(auto names, string_set(members, "usage"));
  KVS_RETURN_IF_ERROR(reply_error(marks, "usage"));
  std::map<std::string, storage::ContextUsage> out;
  for (auto& n : names)
    if (n.starts_with(prefix)) out[n].context = n;
  for (size_t i = 0; marks->type == REDIS_REPLY_ARRAY && i + 1 < marks->elements; i += 2) {
    auto it = out.find(std::string(reply_str(marks->element[i])));
    if (it == out.end()) continue;
    unsigned long long stamp = 0;
    unsigned depth = 0;
    if (std::sscanf(std::string(reply_str(marks->element[i + 1])).c_str(), "%llu %u", &stamp, &depth) == 2)
      it->second.used = stamp, it->second.depth = depth;
  }
  return out;
}

std::vector<storage::ContextUsage> in_name_order(std::map<std::string, storage::ContextUsage>&& listed) {
  std::vector<storage::ContextUsage> v;
  v.reserve(listed.size());
  for (auto& [name, u] : listed) v.push_back(std::move(u));
  return v;
}

Status add_sizes(const redisReply* sizes, const std::string& name, storage::ContextUsage& u,
                 std::set<uint32_t>& chunks) {
  KVS_RETURN_IF_ERROR(reply_error(sizes, "usage"));
  for (size_t e = 0; sizes->type == REDIS_REPLY_ARRAY && e + 1 < sizes->elements; e += 2) {
    unsigned chunk = 0, level = 0;
    unsigned long long size = 0;
    if (std::sscanf(std::string(reply_str(sizes->element[e])).c_str(), "%u:%u", &chunk, &level) != 2 ||
        std::sscanf(std::string(reply_str(sizes->element[e + 1])).c_str(), "%llu", &size) != 1)
      return make_status(StatusCode::corrupt_data, "redis size table '{}' has a malformed entry", name);
    u.bytes += size;
    chunks.insert(chunk);
  }
  return {};
}

}  // namespace kvstream::redis::detail

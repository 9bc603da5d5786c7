#include "storage/redis/redis_marks.hpp"

#include <cstdio>

#include "storage/protocol.hpp"
#include "storage/redis/redis_conn.hpp"

namespace kvstream::redis::detail {

namespace {
// Lua numbers are doubles: stamps (us since the epoch, about 1.8e15) stay exact below 2^53.
constexpr uint64_t kMaxLuaExact = uint64_t(1) << 53;
}  // namespace

const char* const kTouchScript =
    "local stamp = tonumber(ARGV[1]) "
    "for i = 2, #ARGV, 2 do "
    "  if redis.call('SISMEMBER', KEYS[2], ARGV[i]) == 1 then "
    "    local cur = redis.call('HGET', KEYS[1], ARGV[i]) "
    "    local s = cur and tonumber(string.match(cur, '^(%d+)')) or -1 "
    "    if stamp >= s then redis.call('HSET', KEYS[1], ARGV[i], ARGV[1] .. ' ' .. ARGV[i + 1]) end "
    "  end "
    "end "
    "return 0";

Result<std::vector<std::string>> touch_args(std::span<const storage::ContextTouch> contexts, uint64_t stamp) {
  for (const auto& t : contexts)
    KVS_RETURN_IF_ERROR(storage::validate_id(t.context, storage::kMaxContextBytes, "context id"));
  if (stamp == 0) stamp = storage::next_write_version();
  if (stamp >= kMaxLuaExact)
    return make_status(StatusCode::invalid_argument, "a use stamp at or above 2^53 (Redis keeps marks as Lua numbers)");
  std::vector<std::string> args{std::to_string(stamp)};
  for (const auto& t : contexts) args.push_back(t.context), args.push_back(std::to_string(t.depth));
  return args;
}

void apply_marks(const redisReply* marks, std::map<std::string, storage::ContextUsage>& out) {
  for (size_t i = 0; marks->type == REDIS_REPLY_ARRAY && i + 1 < marks->elements; i += 2) {
    auto it = out.find(std::string(reply_str(marks->element[i])));
    if (it == out.end()) continue;
    unsigned long long stamp = 0;
    unsigned depth = 0;
    if (std::sscanf(std::string(reply_str(marks->element[i + 1])).c_str(), "%llu %u", &stamp, &depth) == 2)
      it->second.used = stamp, it->second.depth = depth;
  }
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

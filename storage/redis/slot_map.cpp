#include "storage/redis/slot_map.hpp"

#include <algorithm>
#include <charconv>
#include <mutex>

#include <fmt/format.h>

namespace kvstream::redis::detail {

namespace {

bool as_int(const redisReply* r, long long& v) {
  if (r->type == REDIS_REPLY_INTEGER) return v = r->integer, true;
  const std::string_view s = reply_str(r);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return r->type == REDIS_REPLY_STRING && ec == std::errc() && end == s.data() + s.size() && !s.empty();
}
bool valid_range(long long a, long long b) { return a >= 0 && b >= a && b < kSlots; }

Status not_topology(std::string_view what) {
  return make_status(StatusCode::corrupt_data, "not a cluster topology reply: {}", what);
}

}  // namespace

// RESP2 shape: [ ["slots", [s0, e0, ...], "nodes", [ [k, v, k, v ...], ... ]], ... ]
Result<std::vector<ShardNodes>> parse_cluster_shards(const redisReply* r) {
  KVS_RETURN_IF_ERROR(reply_error(r, "CLUSTER SHARDS"));
  if (r->type != REDIS_REPLY_ARRAY) return not_topology("CLUSTER SHARDS is not an array");
  std::vector<ShardNodes> out;
  for (size_t i = 0; i < r->elements; ++i) {
    const redisReply* shard = r->element[i];
    if (shard->type != REDIS_REPLY_ARRAY || shard->elements % 2) return not_topology("a shard is not a map");
    ShardNodes s;
    std::string failed_primary;
    for (size_t k = 0; k + 1 < shard->elements; k += 2) {
      const std::string_view key = reply_str(shard->element[k]);
      const redisReply* v = shard->element[k + 1];
      if (key == "slots") {
        if (v->type != REDIS_REPLY_ARRAY || v->elements % 2) return not_topology("slots is not a list of ranges");
        for (size_t j = 0; j < v->elements; j += 2) {
          long long a = 0, b = 0;
          if (!as_int(v->element[j], a) || !as_int(v->element[j + 1], b) || !valid_range(a, b))
            return not_topology("a slot range");
          s.slots.emplace_back(uint16_t(a), uint16_t(b));
        }
      } else if (key == "nodes") {
        if (v->type != REDIS_REPLY_ARRAY) return not_topology("nodes is not a list");
        for (size_t n = 0; n < v->elements; ++n) {
          const redisReply* node = v->element[n];
          if (node->type != REDIS_REPLY_ARRAY || node->elements % 2) return not_topology("a node is not a map");
          std::string ip, endpoint, role, health = "online";
          long long port = 0;
          for (size_t f = 0; f + 1 < node->elements; f += 2) {
            const std::string_view name = reply_str(node->element[f]);
            const redisReply* val = node->element[f + 1];
            if (name == "ip") ip = reply_str(val);
            else if (name == "endpoint") endpoint = reply_str(val);
            else if (name == "role") role = reply_str(val);
            else if (name == "health") health = reply_str(val);
            else if (name == "port" && !as_int(val, port)) return not_topology("a node's port");
          }
          // The preferred endpoint, unless the node does not know it ('?', empty).
          const std::string host = endpoint.empty() || endpoint == "?" ? ip : endpoint;
          if (host.empty() || port <= 0 || port > 65535) continue;  // no plain TCP port (TLS only): not ours
          const std::string address = fmt::format("{}:{}", host, port);
          if (role == "master" && health == "online") s.primary = address;
          else if (role == "master") failed_primary = address;
          else if (health == "online") s.replicas.push_back(address);
        }
      }
    }
    if (s.primary.empty()) s.primary = failed_primary;  // none online: still where writes belong
    if (!s.slots.empty() && !s.primary.empty()) out.push_back(std::move(s));
  }
  return out;
}

// RESP2 shape: [ [start, end, [ip, port, id, ...], [replica ip, port, id, ...], ...], ... ]
Result<std::vector<ShardNodes>> parse_cluster_slots(const redisReply* r) {
  KVS_RETURN_IF_ERROR(reply_error(r, "CLUSTER SLOTS"));
  if (r->type != REDIS_REPLY_ARRAY) return not_topology("CLUSTER SLOTS is not an array");
  std::vector<ShardNodes> out;
  for (size_t i = 0; i < r->elements; ++i) {
    const redisReply* e = r->element[i];
    long long a = 0, b = 0;
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || !as_int(e->element[0], a) || !as_int(e->element[1], b) ||
        !valid_range(a, b))
      return not_topology("a slot range");
    ShardNodes s;
    s.slots.emplace_back(uint16_t(a), uint16_t(b));
    for (size_t n = 2; n < e->elements; ++n) {
      const redisReply* node = e->element[n];
      long long port = 0;
      if (node->type != REDIS_REPLY_ARRAY || node->elements < 2 || !as_int(node->element[1], port))
        return not_topology("a node");
      const std::string address = fmt::format("{}:{}", reply_str(node->element[0]), port);
      if (n == 2) s.primary = address;
      else s.replicas.push_back(address);
    }
    out.push_back(std::move(s));
  }
  return out;
}

void SlotMap::install(const std::vector<ShardNodes>& shards) {
  std::unique_lock lk(mu_);
  routes_.clear();
  slot_route_.fill(-1);
  for (const auto& s : shards) {
    routes_.push_back({s.primary, s.replicas});
    for (auto [a, b] : s.slots)
      for (uint32_t slot = a; slot <= b; ++slot) slot_route_[slot] = int32_t(routes_.size() - 1);
  }
  ++version_;
}

SlotMap::Route SlotMap::route(uint16_t slot) const {
  std::shared_lock lk(mu_);
  const int32_t r = slot_route_[slot % kSlots];
  return r < 0 ? Route{} : routes_[size_t(r)];
}

void SlotMap::moved(uint16_t slot, const std::string& address) {
  std::unique_lock lk(mu_);
  size_t r = 0;
  while (r < routes_.size() && !(routes_[r].primary == address && routes_[r].replicas.empty())) ++r;
  if (r == routes_.size()) routes_.push_back({address, {}});
  slot_route_[slot % kSlots] = int32_t(r);
}

std::vector<std::string> SlotMap::addresses() const {
  std::shared_lock lk(mu_);
  std::vector<std::string> out;
  auto add = [&](const std::string& a) {
    if (!a.empty() && std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  };
  for (const auto& r : routes_) add(r.primary);
  for (const auto& r : routes_)
    for (const auto& x : r.replicas) add(x);
  return out;
}

uint64_t SlotMap::version() const {
  std::shared_lock lk(mu_);
  return version_;
}

uint32_t SlotMap::covered() const {
  std::shared_lock lk(mu_);
  uint32_t n = 0;
  for (int32_t r : slot_route_) n += r >= 0;
  return n;
}

}  // namespace kvstream::redis::detail

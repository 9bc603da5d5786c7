// Redis Cluster topology as a client routes by it: what CLUSTER SHARDS (or, on older
// servers, CLUSTER SLOTS) reports, parsed, and the slot -> primary + replicas map
// the cluster client's workers share. Internal.
#pragma once

#include <array>
#include <cstdint>
#include <shared_mutex>
#include <string>
#include <vector>

#include "kvstream/status.hpp"
#include "storage/redis/hash_slot.hpp"
#include "storage/redis/redis_conn.hpp"

namespace kvstream::redis::detail {

struct ShardNodes {
  std::vector<std::pair<uint16_t, uint16_t>> slots;  ///< inclusive ranges
  std::string primary;                               ///< host:port
  std::vector<std::string> replicas;                 ///< online replicas, host:port
};

/// One node's view of the cluster. Errors: corrupt_data (not such a reply).
Result<std::vector<ShardNodes>> parse_cluster_shards(const redisReply* r);
Result<std::vector<ShardNodes>> parse_cluster_slots(const redisReply* r);

/// Thread-safe slot map. Replaced whole by a refresh; a MOVED reply patches one slot
/// until the next refresh.
class SlotMap {
 public:
  struct Route {
    std::string primary;  ///< empty: the slot has no known node
    std::vector<std::string> replicas;
  };
  SlotMap() { slot_route_.fill(-1); }

  void install(const std::vector<ShardNodes>& shards);
  [[nodiscard]] Route route(uint16_t slot) const;
  void moved(uint16_t slot, const std::string& address);
  /// Every node named in the map (primaries first).
  [[nodiscard]] std::vector<std::string> addresses() const;
  /// Bumped by every install (a worker skips a refresh someone did since it looked).
  [[nodiscard]] uint64_t version() const;
  /// Slots that have a primary.
  [[nodiscard]] uint32_t covered() const;

 private:
  mutable std::shared_mutex mu_;
  std::vector<Route> routes_;
  std::array<int32_t, kSlots> slot_route_;
  uint64_t version_ = 0;
};

}  // namespace kvstream::redis::detail

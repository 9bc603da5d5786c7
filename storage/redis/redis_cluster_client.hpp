// The Redis Cluster storage client (redis_storage.hpp, RedisConfig::cluster). Internal:
// redis::connect builds it.
#pragma once

#include <memory>

#include "kvstream/redis_storage.hpp"

namespace kvstream::redis::detail {

Result<std::unique_ptr<storage::Client>> connect_cluster(const RedisConfig& config, transport::Deadline deadline,
                                                         const transport::CancelToken& cancel);

}  // namespace kvstream::redis::detail

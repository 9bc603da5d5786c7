// Library-wide logging controls. kvstream logs through spdlog under the logger name
// "kvstream"; a runtime can lower or raise its level, or silence it.
#pragma once

#include <string_view>

#include "kvstream/status.hpp"

namespace kvstream {

enum class LogLevel : uint8_t { trace, debug, info, warn, error, off };

/// Sets the level of kvstream's logger (default: info). StoreConfig's log.level
/// (KVSTREAM_LOG_LEVEL through StoreConfig::from_env) sets it when a KvStore opens.
void set_log_level(LogLevel level) noexcept;

/// Parses "trace", "debug", "info", "warn", "error" or "off".
Result<LogLevel> parse_log_level(std::string_view name);

}  // namespace kvstream

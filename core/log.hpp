// Internal logging: every library folder logs through this one spdlog logger.
#pragma once

#include <spdlog/spdlog.h>

#include "kvstream/status.hpp"

namespace kvstream::detail {

/// The "kvstream" logger (created on first use, writes to stderr).
spdlog::logger& logger();

/// Logs `s` at warn level where an error is first seen, then returns it unchanged,
/// so callers can `return log_error(make_status(...));`.
Status log_error(Status s);

}  // namespace kvstream::detail

#define KVS_LOG_INFO(...) ::kvstream::detail::logger().info(__VA_ARGS__)
#define KVS_LOG_WARN(...) ::kvstream::detail::logger().warn(__VA_ARGS__)
#define KVS_LOG_DEBUG(...) ::kvstream::detail::logger().debug(__VA_ARGS__)
#define KVS_LOG_ERROR(...) ::kvstream::detail::logger().error(__VA_ARGS__)

// Internal logging: every library folder logs through this one spdlog logger.
#pragma once

#include <spdlog/spdlog.h>

#include "kvstream/status.hpp"

namespace kvstream::detail {

/// The "kvstream" logger (created on first use, writes to stderr).
spdlog::logger& logger();

/// An error already logged where it was first seen, reported again (each later call
/// on a connection that broke): built like make_status, not logged a second time.
template <typename... Args>
Status repeated_status(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

/// An error whose caller logs it itself, with what follows from it or through a
/// rate-limited log (a node's failed logins, which a flood must not turn into a line
/// each): built like make_status, not logged here.
template <typename... Args>
Status unlogged_status(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace kvstream::detail

#define KVS_LOG_INFO(...) ::kvstream::detail::logger().info(__VA_ARGS__)
#define KVS_LOG_WARN(...) ::kvstream::detail::logger().warn(__VA_ARGS__)
#define KVS_LOG_DEBUG(...) ::kvstream::detail::logger().debug(__VA_ARGS__)
#define KVS_LOG_ERROR(...) ::kvstream::detail::logger().error(__VA_ARGS__)

#include "core/log.hpp"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "kvstream/log.hpp"

namespace kvstream {

namespace {
spdlog::level::level_enum to_spdlog(LogLevel l) {
  switch (l) {
    case LogLevel::trace: return spdlog::level::trace;
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::error: return spdlog::level::err;
    case LogLevel::off: return spdlog::level::off;
  }
  return spdlog::level::info;
}
}  // namespace

Result<LogLevel> parse_log_level(std::string_view name) {
  if (name == "trace") return LogLevel::trace;
  if (name == "debug") return LogLevel::debug;
  if (name == "info") return LogLevel::info;
  if (name == "warn" || name == "warning") return LogLevel::warn;
  if (name == "error") return LogLevel::error;
  if (name == "off") return LogLevel::off;
  return make_status(StatusCode::invalid_argument, "unknown log level '{}'", name);
}

void set_log_level(LogLevel level) noexcept { detail::logger().set_level(to_spdlog(level)); }

namespace detail {

spdlog::logger& logger() {
  // One logger for the whole library; stderr so tools can keep stdout for results.
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = std::make_shared<spdlog::logger>("kvstream", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    l->set_pattern("[%H:%M:%S.%e] [kvstream] [%^%l%$] %v");
    // Info until told otherwise: set_log_level, or a StoreConfig's log.level (which
    // reads KVSTREAM_LOG_LEVEL in StoreConfig::from_env, the one reader of the
    // environment).
    l->set_level(to_spdlog(LogLevel::info));
    return l;
  }();
  return *instance;
}

Status log_error(Status s) {
  if (!s.ok()) logger().warn("{}", s.to_string());
  return s;
}

}  // namespace detail
}  // namespace kvstream

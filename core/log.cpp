#include "core/log.hpp"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/base_sink.h>
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
LogLevel from_spdlog(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::trace: return LogLevel::trace;
    case spdlog::level::debug: return LogLevel::debug;
    case spdlog::level::info: return LogLevel::info;
    case spdlog::level::warn: return LogLevel::warn;
    case spdlog::level::err:
    case spdlog::level::critical: return LogLevel::error;
    default: return LogLevel::off;
  }
}

// The logger's one sink: a host's LogSink when one is installed, stderr otherwise.
// Routing inside one sink (instead of swapping the logger's sink list, which spdlog
// does not guard) keeps set_log_sink safe while other threads log.
class RouterSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  RouterSink() : stderr_(std::make_shared<spdlog::sinks::stderr_color_sink_mt>()) {
    stderr_->set_pattern("[%H:%M:%S.%e] [kvstream] [%^%l%$] %v");
  }
  void install(LogSink sink) {
    std::lock_guard lock(mutex_);  // base_sink's mutex: no line is being written now
    host_ = std::move(sink);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (!host_) {
      stderr_->log(msg);
      return;
    }
    try {
      host_(from_spdlog(msg.level), std::string_view(msg.payload.data(), msg.payload.size()));
    } catch (...) {
      // A host's sink must not take a kvstream thread down with it.
    }
  }
  void flush_() override { stderr_->flush(); }

 private:
  std::shared_ptr<spdlog::sinks::stderr_color_sink_mt> stderr_;
  LogSink host_;
};

const std::shared_ptr<RouterSink>& router() {
  static const auto instance = std::make_shared<RouterSink>();
  return instance;
}

}  // namespace

std::string_view log_level_name(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::trace: return "trace";
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warn: return "warn";
    case LogLevel::error: return "error";
    case LogLevel::off: return "off";
  }
  return "off";
}

void set_log_sink(LogSink sink) noexcept {
  try {
    router()->install(std::move(sink));
  } catch (...) {
    // Moving a std::function does not throw; nothing else here allocates.
  }
}

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
    auto l = std::make_shared<spdlog::logger>("kvstream", router());
    // Info until told otherwise: set_log_level, or a StoreConfig's log.level (which
    // reads KVSTREAM_LOG_LEVEL in StoreConfig::from_env, the one reader of the
    // environment).
    l->set_level(to_spdlog(LogLevel::info));
    return l;
  }();
  return *instance;
}

}  // namespace detail
}  // namespace kvstream

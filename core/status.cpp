#include "kvstream/status.hpp"

#include "core/log.hpp"

namespace kvstream {

std::string_view status_code_name(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::out_of_range: return "out_of_range";
    case StatusCode::not_found: return "not_found";
    case StatusCode::already_exists: return "already_exists";
    case StatusCode::corrupt_data: return "corrupt_data";
    case StatusCode::unsupported: return "unsupported";
    case StatusCode::unavailable: return "unavailable";
    case StatusCode::timed_out: return "timed_out";
    case StatusCode::cancelled: return "cancelled";
    case StatusCode::permission_denied: return "permission_denied";
    case StatusCode::io_error: return "io_error";
    case StatusCode::resource_exhausted: return "resource_exhausted";
    case StatusCode::internal: return "internal";
    case StatusCode::no_space: return "no_space";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return fmt::format("{}: {}", status_code_name(code_), message_);
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, fmt::format("{}: {}", context, message_));
}

namespace detail {

void log_new_error(const Status& s) noexcept {
  if (s.ok()) return;
  spdlog::level::level_enum level = spdlog::level::debug;
  switch (s.code()) {
    case StatusCode::internal: level = spdlog::level::err; break;
    case StatusCode::io_error:
    case StatusCode::corrupt_data:
    case StatusCode::unavailable:
    case StatusCode::permission_denied:
    case StatusCode::resource_exhausted: level = spdlog::level::warn; break;
    case StatusCode::no_space: level = spdlog::level::info; break;
    default: break;
  }
  try {
    spdlog::logger& l = logger();
    if (l.should_log(level)) l.log(level, "{}", s.to_string());
  } catch (...) {
    // A log line that cannot be written must not turn an error into a crash.
  }
}

}  // namespace detail
}  // namespace kvstream

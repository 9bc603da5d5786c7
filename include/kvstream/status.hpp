// Status and Result<T>: the one error type that crosses kvstream's public API.
//
// No exception crosses the API. A call that can fail returns Status (no value) or
// Result<T> (a value or a Status). Outputs passed by reference are written only on
// success, so a caller never sees half-written state after an error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace kvstream {

/// Why a call failed. The storage protocol carries these as its own fixed numbers
/// (storage/wire_status.hpp), so this enum is free to change.
enum class StatusCode : uint8_t {
  ok = 0,
  invalid_argument = 1,   ///< the caller passed something the call cannot accept
  out_of_range = 2,       ///< an index, size or position outside its bound
  not_found = 3,          ///< a named object does not exist
  already_exists = 4,     ///< create of an object that exists
  corrupt_data = 5,       ///< bytes failed a structural or checksum check
  unsupported = 6,        ///< the path asked for is not available here (no GPU, no GPUDirect...)
  unavailable = 7,        ///< a peer or device is down or unreachable
  timed_out = 8,          ///< the deadline passed first
  cancelled = 9,          ///< the caller cancelled
  permission_denied = 10, ///< credentials missing or wrong
  io_error = 11,          ///< the operating system refused an I/O
  resource_exhausted = 12,///< a bounded resource (memory, connection slots) is busy: try again later
  internal = 13,          ///< a bug in kvstream: please report it
  /// No room to store this (a disk or a tenant's quota is full, Redis at maxmemory):
  /// unlike resource_exhausted, waiting does not help; only removing data does.
  no_space = 14,
};
/// The highest code (for tables indexed by code).
inline constexpr StatusCode kLastStatusCode = StatusCode::no_space;

/// Short lower-case name of a code, e.g. "corrupt_data".
std::string_view status_code_name(StatusCode code) noexcept;

/// The outcome of a call: ok, or a code with a message naming what failed.
class [[nodiscard]] Status {
 public:
  Status() noexcept = default;  ///< ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() noexcept { return {}; }

  [[nodiscard]] bool ok() const noexcept { return code_ == StatusCode::ok; }
  explicit operator bool() const noexcept { return ok(); }
  [[nodiscard]] StatusCode code() const noexcept { return code_; }
  [[nodiscard]] const std::string& message() const noexcept { return message_; }

  /// "corrupt_data: chunk 3: checksum mismatch", or "ok".
  [[nodiscard]] std::string to_string() const;

  /// The same status with `context` put in front of the message ("while X: ...").
  [[nodiscard]] Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

namespace detail {
/// Logs an error where kvstream first makes it, once, at the level its code calls for
/// (the rule is in kvstream/log.hpp). Passing a status on does not log it again.
void log_new_error(const Status& s) noexcept;
}  // namespace detail

/// Builds an error status with a fmt-formatted message, and logs it (detail::
/// log_new_error): this is where an error is first seen.
template <typename... Args>
Status make_status(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  Status s(code, fmt::format(f, std::forward<Args>(args)...));
  detail::log_new_error(s);
  return s;
}

/// A value of type T, or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::remove_cv_t<T>, Status>, "Result<Status> makes no sense");

 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::in_place_index<1>, std::move(status)) {  // NOLINT
    if (std::get<1>(v_).ok())
      std::get<1>(v_) = Status(StatusCode::internal, "Result built from an ok Status without a value");
  }

  [[nodiscard]] bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  /// The error; an ok Status when there is a value.
  [[nodiscard]] Status status() const { return ok() ? Status{} : std::get<1>(v_); }

  /// The value. Calling these on an error is a bug (checked: std::bad_variant_access).
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  /// On an rvalue the value is moved out by value, so `for (auto& x : f().value())`
  /// cannot dangle.
  T value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  /// The value, or `fallback` on error.
  T value_or(T fallback) const& { return ok() ? std::get<0>(v_) : std::move(fallback); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvstream

/// Returns the Status from the enclosing function when `expr` (a Status) is an error.
#define KVS_RETURN_IF_ERROR(expr)                   \
  do {                                              \
    ::kvstream::Status kvs_status_ = (expr);        \
    if (!kvs_status_.ok()) return kvs_status_;      \
  } while (0)

#define KVS_CONCAT_INNER_(a, b) a##b
#define KVS_CONCAT_(a, b) KVS_CONCAT_INNER_(a, b)

/// `KVS_ASSIGN_OR_RETURN(auto x, f());` binds the value of a Result or returns its Status.
#define KVS_ASSIGN_OR_RETURN(decl, expr) KVS_ASSIGN_OR_RETURN_IMPL_(KVS_CONCAT_(kvs_result_, __LINE__), decl, expr)
#define KVS_ASSIGN_OR_RETURN_IMPL_(tmp, decl, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  decl = std::move(tmp).value()

template <>
struct fmt::formatter<kvstream::Status> : fmt::formatter<std::string_view> {
  template <typename Ctx>
  auto format(const kvstream::Status& s, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(s.to_string(), ctx);
  }
};

// A settings table over one config struct: each row names a field, says what it
// means, and reads and writes it as text. StoreConfig and BackendConfig are each
// described by one such table, so a field added there is documented, settable by
// name and printed by describe() in one place.
#pragma once

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvstream/settings.hpp"
#include "kvstream/status.hpp"

namespace kvstream::settings {

inline Status bad_value(std::string_view name, std::string_view value, std::string_view want) {
  return make_status(StatusCode::invalid_argument, "setting {}: '{}' is not {}", name, value, want);
}

// Text forms of the field types the tables hold.
inline std::string to_text(const std::string& v) { return v; }
inline std::string to_text(bool v) { return v ? "true" : "false"; }
inline std::string to_text(const std::vector<std::string>& v) { return fmt::format("{}", fmt::join(v, ",")); }
template <typename T>
  requires std::is_arithmetic_v<T>
std::string to_text(T v) {
  return fmt::format("{}", v);
}
template <typename Rep, typename Period>
std::string to_text(std::chrono::duration<Rep, Period> v) {
  return fmt::format("{}", v.count());
}

inline Status from_text(std::string_view name, std::string_view v, std::string& out) {
  (void)name;
  out = std::string(v);
  return {};
}
inline Status from_text(std::string_view name, std::string_view v, bool& out) {
  if (v == "true" || v == "1" || v == "yes" || v == "on") out = true;
  else if (v == "false" || v == "0" || v == "no" || v == "off") out = false;
  else return bad_value(name, v, "true or false");
  return {};
}
inline Status from_text(std::string_view name, std::string_view v, std::vector<std::string>& out) {
  (void)name;
  out.clear();
  size_t start = 0;
  while (start <= v.size() && !v.empty()) {
    const size_t comma = v.find(',', start);
    const std::string_view item = v.substr(start, comma == std::string_view::npos ? v.npos : comma - start);
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return {};
}
template <typename T>
  requires std::is_integral_v<T>
Status from_text(std::string_view name, std::string_view v, T& out) {
  T value{};
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), value);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size())
    return bad_value(name, v, std::is_signed_v<T> ? "an integer" : "an unsigned integer");
  out = value;
  return {};
}
inline Status from_text(std::string_view name, std::string_view v, double& out) {
  const std::string s(v);
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno != 0 || !std::isfinite(d)) return bad_value(name, v, "a number");
  out = d;
  return {};
}
template <typename Rep, typename Period>
Status from_text(std::string_view name, std::string_view v, std::chrono::duration<Rep, Period>& out) {
  uint64_t n = 0;
  KVS_RETURN_IF_ERROR(from_text(name, v, n));
  out = std::chrono::duration<Rep, Period>(Rep(n));
  return {};
}

/// One setting of a Config.
template <typename Config>
struct Row {
  std::string_view name;
  std::string_view doc;
  std::function<std::string(const Config&)> get;
  std::function<Status(Config&, std::string_view)> set;
};

/// A row for the field `ref(config)` returns (a reference into the config).
template <typename Config, typename Ref>
Row<Config> field(std::string_view name, std::string_view doc, Ref ref) {
  return {name, doc, [ref](const Config& c) { return to_text(ref(const_cast<Config&>(c))); },
          [ref, name](Config& c, std::string_view v) { return from_text(name, v, ref(c)); }};
}

/// A row for the field `member` of a `Config`, e.g.
/// KVS_SETTING(StoreConfig, "storage.kind", "node, cluster or redis", storage.kind).
#define KVS_SETTING(Config, name, doc, member) \
  ::kvstream::settings::field<Config>(name, doc, [](Config& c) -> auto& { return c.member; })

/// The rows of one config struct, with the operations every config offers.
template <typename Config>
class Table {
 public:
  /// `env_prefix` names the environment variables (KVSTREAM_ + the name upper-cased,
  /// '.' as '_'); empty: the config reads none.
  Table(std::vector<Row<Config>> rows, std::string env_prefix) : rows_(std::move(rows)), env_prefix_(std::move(env_prefix)) {}

  [[nodiscard]] const Row<Config>* find(std::string_view name) const {
    for (const auto& r : rows_)
      if (r.name == name) return &r;
    return nullptr;
  }

  Status set(Config& c, std::string_view name, std::string_view value) const {
    const Row<Config>* r = find(name);
    if (!r) return make_status(StatusCode::not_found, "no setting named '{}' (describe() lists them)", name);
    return r->set(c, value);
  }

  Status set(Config& c, std::string_view assignment) const {
    const size_t eq = assignment.find('=');
    if (eq == std::string_view::npos)
      return make_status(StatusCode::invalid_argument, "'{}' is not name=value", assignment);
    return set(c, assignment.substr(0, eq), assignment.substr(eq + 1));
  }

  [[nodiscard]] Result<std::string> get(const Config& c, std::string_view name) const {
    const Row<Config>* r = find(name);
    if (!r) return make_status(StatusCode::not_found, "no setting named '{}'", name);
    return r->get(c);
  }

  /// The environment variable of a setting; empty when the config reads none.
  [[nodiscard]] std::string env_name(std::string_view name) const {
    if (env_prefix_.empty()) return {};
    std::string e = env_prefix_;
    for (char ch : name) e += ch == '.' ? '_' : char(std::toupper(static_cast<unsigned char>(ch)));
    return e;
  }

  /// `base` with every setting whose environment variable is set replaced by it.
  Result<Config> from_env(Config base) const {
    for (const auto& r : rows_) {
      const std::string var = env_name(r.name);
      if (var.empty()) continue;
      if (const char* v = std::getenv(var.c_str()))
        KVS_RETURN_IF_ERROR(r.set(base, v).with_context(fmt::format("environment variable {}", var)));
    }
    return base;
  }

  [[nodiscard]] std::vector<SettingInfo> info() const {
    const Config defaults{};
    std::vector<SettingInfo> out;
    for (const auto& r : rows_) out.push_back({r.name, r.doc, r.get(defaults), env_name(r.name)});
    return out;
  }

  /// One entry per setting: name, value in force, default, variable, meaning. Names in
  /// `hidden` print only whether they are set (secrets).
  [[nodiscard]] std::string describe(const Config& c, std::initializer_list<std::string_view> hidden = {}) const {
    const Config defaults{};
    auto quoted = [](const std::string& v) { return v.empty() ? std::string("\"\"") : v; };
    std::string out;
    for (const auto& r : rows_) {
      bool secret = false;
      for (auto h : hidden) secret |= h == r.name;
      std::string value = r.get(c);
      if (secret && !value.empty()) value = "(set)";
      const std::string env = env_name(r.name);
      out += fmt::format("{} = {}  [default: {}{}]\n    {}\n", r.name, quoted(value),
                         secret ? "\"\"" : quoted(r.get(defaults)), env.empty() ? "" : "; env " + env, r.doc);
    }
    return out;
  }

 private:
  std::vector<Row<Config>> rows_;
  std::string env_prefix_;
};

}  // namespace kvstream::settings

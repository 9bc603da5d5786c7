// A test's own temporary directory, <tmp>/<prefix>-<pid>-<n>: made empty, removed with
// the object. A test that crashes (a signal, ctest's timeout) runs no destructor and
// leaves its directory behind, so the first TempDir of each prefix in a process also
// removes the directories of that prefix whose process no longer runs: a crash costs
// a directory until the next run, not one for good.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

namespace kvstream::testing {

namespace temp_dir_detail {

/// The pid in `name` when it is "<prefix>-<pid>" or "<prefix>-<pid>-<anything>".
inline std::optional<pid_t> owner(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() + 1 || !name.starts_with(prefix) || name[prefix.size()] != '-')
    return std::nullopt;
  const std::string_view rest = name.substr(prefix.size() + 1);
  pid_t pid = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
  if (ec != std::errc() || end == rest.data() || pid <= 0) return std::nullopt;
  if (end != rest.data() + rest.size() && *end != '-') return std::nullopt;
  return pid;
}

/// Whether process `pid` has ended (one that runs under another user still runs).
inline bool gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

/// Removes, once per process and prefix, what ended processes left under `prefix`.
inline void sweep(const std::string& prefix) {
  static std::mutex mu;
  static std::set<std::string> swept;
  std::lock_guard lock(mu);
  if (!swept.insert(prefix).second) return;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::temp_directory_path(), ec)) {
    const auto pid = owner(entry.path().filename().native(), prefix);
    if (!pid || *pid == ::getpid() || !gone(*pid)) continue;
    std::error_code ignored;
    std::filesystem::remove_all(entry.path(), ignored);
  }
}

}  // namespace temp_dir_detail

class TempDir {
 public:
  /// An empty directory <tmp>/<prefix>-<pid>-<n> (`prefix` without digits after a '-',
  /// so that one prefix's names are not another's).
  explicit TempDir(const std::string& prefix) {
    static std::atomic<int> counter{0};
    temp_dir_detail::sweep(prefix);
    path_ = std::filesystem::temp_directory_path() / fmt::format("{}-{}-{}", prefix, ::getpid(), counter++);
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    std::filesystem::create_directories(path_, ec);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  [[nodiscard]] std::string string() const { return path_.string(); }
  [[nodiscard]] std::filesystem::path operator/(const std::filesystem::path& p) const { return path_ / p; }

 private:
  std::filesystem::path path_;
};

}  // namespace kvstream::testing

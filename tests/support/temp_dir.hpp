// A test's own temporary directory, <tmp>/<prefix>-<pid>-<n>: made empty, removed with
// the object. A test that crashes (a signal, ctest's timeout) runs no destructor and
// leaves its directory behind, so the first TempDir of each prefix in a process also
// removes the directories of that prefix whose process no longer runs, or whose pid
// a process that started after the directory last changed has taken since: a crash
// costs a directory until the next run, not one for good.
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
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

/// When process `pid` started, in seconds since the epoch (/proc: its start in clock
/// ticks after boot, and the boot time, whole seconds); nullopt where unknown.
inline std::optional<double> started_at(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return std::nullopt;
  // Field 22, counted after the command name's closing parenthesis (field 2).
  auto at = line.rfind(')');
  if (at == std::string::npos) return std::nullopt;
  std::string_view rest = std::string_view(line).substr(at + 1);
  unsigned long long ticks = 0;
  for (int field = 3; field <= 22; ++field) {
    rest.remove_prefix(std::min(rest.find_first_not_of(' '), rest.size()));
    const auto end = std::min(rest.find(' '), rest.size());
    if (field == 22 && std::from_chars(rest.data(), rest.data() + end, ticks).ec != std::errc()) return std::nullopt;
    rest.remove_prefix(end);
  }
  std::ifstream boot("/proc/stat");
  for (std::string key; boot >> key;) {
    if (key == "btime") {
      double btime = 0;
      boot >> btime;
      return btime + double(ticks) / double(::sysconf(_SC_CLK_TCK));
    }
    boot.ignore(1 << 20, '\n');
  }
  return std::nullopt;
}

/// Whether the directory at `path`, named for process `pid`, was left by an earlier
/// holder of that pid: the process that has it now started after the directory last
/// changed (its owner made it after starting). Two seconds of margin: the boot time
/// is whole seconds.
inline bool pid_reused(pid_t pid, const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  const auto start = started_at(pid);
  return start && double(st.st_mtim.tv_sec) + 2.0 < *start;
}

/// Removes, once per process and prefix, what ended processes left under `prefix`.
inline void sweep(const std::string& prefix) {
  static std::mutex mu;
  static std::set<std::string> swept;
  std::lock_guard lock(mu);
  if (!swept.insert(prefix).second) return;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::temp_directory_path(), ec)) {
    const auto pid = owner(entry.path().filename().native(), prefix);
    if (!pid || *pid == ::getpid() || (!gone(*pid) && !pid_reused(*pid, entry.path()))) continue;
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

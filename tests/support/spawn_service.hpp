// Starts a program a test needs (etcd, redis-server, redis-cli, kvstream-server) with
// its stderr (and, unless the caller reads it, its stdout) in a file of its own. A
// service must not hold the test's output: ctest reads a test's output until every
// holder closes it, so a test that crashed with a service still running would be
// reported only at its time limit, minutes later and as a timeout instead of the crash
// (seen under TSan when UCX's hooks were on: ctest still waiting 16 minutes after a
// test's SEGFAULT; now 1 s). Such a service outlives the crashed test; its files say
// whose it was.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/types.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;

namespace kvstream::testing {

struct SpawnOptions {
  /// Where stdout goes: this descriptor (a pipe the caller reads), or -1 for `output`.
  int stdout_fd = -1;
  /// "NAME=value" entries that replace or add to this process's environment.
  std::vector<std::string> env;
};

/// Runs `args` (args[0] the program's path) with stderr, and stdout unless
/// `options.stdout_fd` says otherwise, appended to `output`; its PID, or -1 when it
/// could not be started.
inline pid_t spawn_service(const std::vector<std::string>& args, const std::filesystem::path& output,
                           const SpawnOptions& options = {}) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) {
    const std::string_view entry(*e);
    bool replaced = false;
    for (const auto& v : options.env)
      replaced |= entry.substr(0, entry.find('=') + 1) == std::string_view(v).substr(0, v.find('=') + 1);
    if (!replaced) envp.push_back(*e);
  }
  for (const auto& v : options.env) envp.push_back(const_cast<char*>(v.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, output.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (options.stdout_fd >= 0)
    posix_spawn_file_actions_adddup2(&fa, options.stdout_fd, 1);
  else
    posix_spawn_file_actions_adddup2(&fa, 2, 1);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

}  // namespace kvstream::testing

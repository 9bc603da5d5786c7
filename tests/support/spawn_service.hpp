// Starts a program a test needs (etcd, redis-server, redis-cli) with its stdout and
// stderr in a file of its own. A service must not hold the test's output: ctest reads
// a test's output until every holder closes it, so a test that crashed with a
// service still running would be reported only at its time limit, minutes later and
// as a timeout instead of the crash (seen under TSan without the Makefile's UCX
// settings: ctest still waiting 16 minutes after a test's SEGFAULT; now 1 s). Such a service outlives the crashed test; its files say whose it was.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

extern char** environ;

namespace kvstream::testing {

/// Runs `args` (args[0] the program's path) with stdout and stderr appended to
/// `output`; its PID, or -1 when it could not be started.
inline pid_t spawn_service(const std::vector<std::string>& args, const std::filesystem::path& output) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, output.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

}  // namespace kvstream::testing

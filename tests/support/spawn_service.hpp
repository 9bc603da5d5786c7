// Starts a program a test needs (etcd, redis-server, redis-cli, kvstream-server) with
// its stderr (and, unless the caller reads it, its stdout) in a file of its own. A
// service must not hold the test's output: ctest reads a test's output until every
// holder closes it, so a test that crashed with a service still running would be
// reported only at its time limit, minutes later and as a timeout instead of the crash
// (seen under TSan when UCX's hooks were on: ctest still waiting 16 minutes after a
// test's SEGFAULT; now 1 s).
//
// A service also dies with the test: it is started through setpriv(1) with a parent
// death signal of SIGKILL, so a test that crashed, or that ctest killed at its time
// limit, leaves no etcd, redis-server or node behind on the machine. The signal comes
// when the *thread* that started the child ends, not the process, so every service is
// started from one thread that lives as long as the process (the node checker restarts
// its node from a thread that ends long before the node should).
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>
#include <sys/types.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

extern char** environ;

namespace kvstream::testing {

struct SpawnOptions {
  /// Where stdout goes: this descriptor (a pipe the caller reads), or -1 for `output`.
  int stdout_fd = -1;
  /// "NAME=value" entries that replace or add to this process's environment.
  std::vector<std::string> env;
};

namespace detail {

// The one thread that starts services (see the note at the top). Never destroyed: it
// ends with the process, and so do the services it started.
class SpawnThread {
 public:
  static SpawnThread& instance() {
    static auto* t = new SpawnThread;
    return *t;
  }
  pid_t run(std::function<pid_t()> spawn) {
    std::packaged_task<pid_t()> task(std::move(spawn));
    auto pid = task.get_future();
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return pid.get();
  }

 private:
  SpawnThread() {
    std::thread([this] {
      for (;;) {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        auto task = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        task();
      }
    }).detach();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<pid_t()>> queue_;
};

// util-linux's setpriv, where this machine has it (Debian's is essential); without it
// a service runs as before and can outlive a crashed test.
inline const char* setpriv_path() {
  static const char* path = ::access("/usr/bin/setpriv", X_OK) == 0 ? "/usr/bin/setpriv" : nullptr;
  return path;
}

}  // namespace detail

/// Runs `args` (args[0] the program's path) with stderr, and stdout unless
/// `options.stdout_fd` says otherwise, appended to `output`; its PID, or -1 when it
/// could not be started.
inline pid_t spawn_service(const std::vector<std::string>& args, const std::filesystem::path& output,
                           const SpawnOptions& options = {}) {
  std::vector<char*> argv;
  static char setpriv_args[][16] = {"--pdeathsig", "KILL", "--"};
  if (const char* setpriv = detail::setpriv_path()) {
    argv.push_back(const_cast<char*>(setpriv));
    for (auto* a : setpriv_args) argv.push_back(a);
  }
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
  // setpriv execs the service, so the PID is the service's own.
  const pid_t pid = detail::SpawnThread::instance().run([&] {
    pid_t child = -1;
    return posix_spawn(&child, argv[0], &fa, nullptr, argv.data(), envp.data()) == 0 ? child : -1;
  });
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

}  // namespace kvstream::testing

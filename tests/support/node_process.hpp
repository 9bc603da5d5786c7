// A kvstream-server run as a process of its own, for the tools that must kill it
// (-9) or read its resident size: started with its arguments, ready once it has
// printed "listening on <address>", stopped by PID. Its log (stderr) goes to a file
// that is copied to ours when it stops (tests/support/spawn_service.hpp says why).
#pragma once

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/spawn_service.hpp"
#include "tests/support/temp_dir.hpp"

namespace kvstream::testing {

class NodeProcess {
 public:
  NodeProcess() = default;
  NodeProcess(const NodeProcess&) = delete;
  ~NodeProcess() { kill(); }

  /// Starts `bin args...` with KVSTREAM_LOG_LEVEL=`log_level` and waits up to 10 s for
  /// its "listening on" line. False when it did not come up (it is then gone).
  bool start(const std::string& bin, const std::vector<std::string>& args, const std::string& log_level) {
    kill();
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return false;
    log_path_ = (logs_ / "node.log").string();  // the node creates it; copy_log removes it
    std::vector<std::string> argv{bin};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = spawn_service(argv, log_path_, {.stdout_fd = out[1], .env = {"KVSTREAM_LOG_LEVEL=" + log_level}});
    ::close(out[1]);
    std::string line;
    pollfd p{out[0], POLLIN, 0};
    char ch = 0;
    while (line.size() < 200 && ::poll(&p, 1, 10000) > 0 && ::read(out[0], &ch, 1) == 1 && ch != '\n') line += ch;
    // Its later output (the closing line) goes nowhere; SIGPIPE is the node's own
    // business once it is being stopped.
    ::close(out[0]);
    const auto at = line.rfind(' ');
    if (pid_ < 0 || line.rfind("listening on", 0) != 0 || at == std::string::npos) {
      kill();
      return false;
    }
    address_ = line.substr(at + 1);
    return true;
  }

  /// Sends `sig` (SIGKILL: a crash; SIGTERM: an orderly stop) and waits for the exit.
  void kill(int sig = SIGKILL) {
    if (pid_ > 0) {
      ::kill(pid_, sig);
      int st = 0;
      ::waitpid(pid_, &st, 0);
      pid_ = -1;
    }
    copy_log();
  }

  [[nodiscard]] const std::string& address() const { return address_; }
  [[nodiscard]] pid_t pid() const { return pid_; }
  /// Lines the running node has logged so far (its stderr).
  [[nodiscard]] uint64_t log_lines() const {
    uint64_t n = 0;
    if (const int fd = ::open(log_path_.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
      char buf[4096];
      for (ssize_t got; (got = ::read(fd, buf, sizeof buf)) > 0;) n += uint64_t(std::count(buf, buf + got, '\n'));
      ::close(fd);
    }
    return n;
  }

 private:
  TempDir logs_{"kvstream-node-log"};  // removed with us, or by the next run if we crash
  pid_t pid_ = -1;
  std::string address_;
  std::string log_path_;  // the node's stderr

  // The stopped node's log onto our stderr, then the file removed.
  void copy_log() {
    if (log_path_.empty()) return;
    if (const int fd = ::open(log_path_.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;)
        if (::write(2, buf, size_t(n)) < 0) break;
      ::close(fd);
    }
    ::unlink(log_path_.c_str());
    log_path_.clear();
  }
};

}  // namespace kvstream::testing

// A kvstream-server run as a process of its own, for the tools that must kill it
// (-9) or read its resident size: started with its arguments, ready once it has
// printed "listening on <address>", stopped by PID.
#pragma once

#include <csignal>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

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
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv{const_cast<char*>(bin.c_str())};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::setenv("KVSTREAM_LOG_LEVEL", log_level.c_str(), 1);
      ::dup2(out[1], 1);
      ::execv(bin.c_str(), argv.data());
      ::_exit(127);
    }
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
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }

  [[nodiscard]] const std::string& address() const { return address_; }
  [[nodiscard]] pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::string address_;
};

}  // namespace kvstream::testing

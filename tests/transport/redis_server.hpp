// A redis-server for tests: started on a free loopback port in its own temporary
// directory, stopped (and the directory removed) on destruction. Tests skip when
// redis-server is not installed or kvstream was built without hiredis.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kvstream/redis_storage.hpp"
#include "tests/support/spawn_service.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/transport/free_port.hpp"

namespace kvstream::transport::test_util {

/// TLS for a test server (redis-server's tls-* options; TestCerts makes the files).
struct RedisServerTls {
  std::string cert, key, ca;
  std::string auth_clients = "no";  ///< tls-auth-clients: no, yes or optional
  /// Keep a clear port beside the TLS one (a cluster fixture manages its nodes over
  /// it); false: TLS only (--port 0).
  bool clear_port_too = false;
};

class RedisServer {
 public:
  /// Why Redis tests cannot run here ("" when they can).
  static std::string unavailable_reason() {
    if (!redis::available()) return "kvstream was built without hiredis (libhiredis-dev, KVSTREAM_WITH_REDIS)";
    if (program().empty()) return "redis-server is not installed (Debian package redis-server)";
    return {};
  }

  /// Starts one under <tmp>/<tag>-<pid>-<n> (with `extra_args` on its command line);
  /// started() says whether it came up. `cluster`: a cluster node, its bus on a second
  /// free port (port + 10000, redis' default, can pass 65535).
  /// `tls`: serve TLS on tls_port() (and in clear on port() only when
  /// tls->clear_port_too).
  explicit RedisServer(const std::string& tag, std::vector<std::string> extra_args = {}, bool cluster = false,
                       std::optional<RedisServerTls> tls = std::nullopt)
      : extra_args_(std::move(extra_args)), cluster_(cluster), tls_(std::move(tls)), dir_(tag) {
    // A free port can be taken between our probe and redis' bind: try a few.
    for (int attempt = 0; attempt < 5 && pid_ <= 0; ++attempt) start();
  }
  ~RedisServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);
      ::kill(pid_, SIGTERM);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  [[nodiscard]] bool started() const { return pid_ > 0; }
  [[nodiscard]] pid_t pid() const { return pid_; }
  [[nodiscard]] uint16_t port() const { return port_; }
  [[nodiscard]] const std::filesystem::path& dir() const { return dir_.path(); }
  [[nodiscard]] std::string address() const { return fmt::format("127.0.0.1:{}", port_); }
  /// The TLS port (0 without TLS) and its address.
  [[nodiscard]] uint16_t tls_port() const { return tls_port_; }
  [[nodiscard]] std::string tls_address() const { return fmt::format("127.0.0.1:{}", tls_port_); }

  /// Stops it at once (SIGKILL), as a crash would.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  /// Whether it answers PING (a plain socket: a cluster node is no storage client).
  /// TLS only: whether its TLS port takes connections.
  [[nodiscard]] bool answers_ping(std::chrono::milliseconds timeout) const {
    if (port_ == 0) return accepts(tls_port_);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    timeval tv{0, suseconds_t(std::chrono::microseconds(timeout).count())};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port_);
    char buf[16] = {};
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                    ::send(fd, "PING\r\n", 6, MSG_NOSIGNAL) == 6 && ::read(fd, buf, sizeof buf - 1) >= 5 &&
                    std::string_view(buf).substr(0, 5) == "+PONG";
    ::close(fd);
    return ok;
  }

  /// A storage client of namespace `ns` on this server.
  Result<std::unique_ptr<storage::Client>> client(std::chrono::milliseconds timeout = std::chrono::seconds(5),
                                                  const std::string& ns = "tenant-a") const {
    redis::RedisConfig cfg;
    cfg.address = address();
    cfg.name_space = ns;
    return redis::connect(cfg, deadline_in(timeout));
  }

 private:
  std::vector<std::string> extra_args_;
  bool cluster_ = false;
  std::optional<RedisServerTls> tls_;
  kvstream::testing::TempDir dir_;
  uint16_t port_ = 0, tls_port_ = 0;
  pid_t pid_ = -1;

  static std::string program() {
    for (const char* d : {"/usr/bin/", "/usr/local/bin/", "/usr/sbin/"})
      if (std::filesystem::exists(std::string(d) + "redis-server")) return std::string(d) + "redis-server";
    return {};
  }
  static bool accepts(uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
  }
  void start() {
    port_ = tls_ && !tls_->clear_port_too ? 0 : free_port();
    const std::string prog = program(), port = std::to_string(port_), dir = dir_.string(),
                      log = (dir_ / "redis.log").string();
    std::vector<std::string> args = {prog,     "--port",       port, "--bind",      "127.0.0.1", "--dir",     dir,
                                     "--save", "",             "--appendonly", "no", "--daemonize", "no", "--logfile",
                                     log};
    if (tls_) {
      tls_port_ = free_port();
      args.insert(args.end(), {"--tls-port", std::to_string(tls_port_), "--tls-cert-file", tls_->cert,
                               "--tls-key-file", tls_->key, "--tls-ca-cert-file", tls_->ca, "--tls-auth-clients",
                               tls_->auth_clients});
      if (cluster_) args.insert(args.end(), {"--tls-cluster", "yes", "--tls-replication", "yes"});
    }
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    if (cluster_)
      args.insert(args.end(), {"--cluster-enabled", "yes", "--cluster-config-file", (dir_ / "nodes.conf").string(),
                               "--cluster-port", std::to_string(free_port())});
    const pid_t pid = kvstream::testing::spawn_service(args, dir_ / "redis.out");
    if (pid < 0) return;
    // Ready when a client connects (PING answered).
    for (int i = 0; i < 100; ++i) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) return;  // exited: port taken
      if (answers_ping(std::chrono::milliseconds(200))) {
        pid_ = pid;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

}  // namespace kvstream::transport::test_util

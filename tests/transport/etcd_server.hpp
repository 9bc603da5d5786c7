// An etcd for tests: one member on two free loopback ports (clients, peers) in its own
// temporary directory, stopped by PID (and the directory removed) on destruction.
// Tests skip when etcd is not installed (Debian package etcd-server).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kvstream/membership.hpp"
#include "tests/support/spawn_service.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/transport/free_port.hpp"

namespace kvstream::transport::test_util {

/// The command line of etcd member `name` on loopback `client_port` and `peer_port`,
/// with its data and log under `dir`, in a new cluster of `initial_cluster`
/// ("name=peer URL,...").
inline std::vector<std::string> etcd_member_args(const std::string& program, const std::string& name,
                                                 const std::filesystem::path& dir, uint16_t client_port,
                                                 uint16_t peer_port, const std::string& initial_cluster) {
  const std::string peer = fmt::format("http://127.0.0.1:{}", peer_port);
  const std::string client = fmt::format("http://127.0.0.1:{}", client_port);
  return {program,
          "--name", name,
          "--data-dir", (dir / (name + ".data")).string(),
          "--listen-client-urls", client,
          "--advertise-client-urls", client,
          "--listen-peer-urls", peer,
          "--initial-advertise-peer-urls", peer,
          "--initial-cluster", initial_cluster,
          "--logger", "zap", "--log-outputs", (dir / (name + ".log")).string()};
}

class EtcdServer {
 public:
  static std::string program() {
    for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"})
      if (std::filesystem::exists(p)) return p;
    return {};
  }

  explicit EtcdServer(const std::string& tag) : dir_(tag) {
    for (int attempt = 0; attempt < 3 && pid_ <= 0; ++attempt) start();
  }
  ~EtcdServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  [[nodiscard]] bool started() const { return pid_ > 0; }

  /// Stops it at once (SIGKILL), as a crash would; restart() brings it back on the same
  /// ports with the same data.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  bool restart() {
    kill();
    spawn();
    return started();
  }
  [[nodiscard]] std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }
  /// Membership settings on this etcd under `prefix`.
  [[nodiscard]] cluster::EtcdConfig config(const std::string& prefix = "/kvs-test/") const {
    cluster::EtcdConfig c;
    c.endpoints = {url()};
    c.prefix = prefix;
    return c;
  }

 private:
  kvstream::testing::TempDir dir_;  // <tmp>/<tag>-<pid>-<n>: its data and logs
  uint16_t port_ = 0;
  pid_t pid_ = -1;

  uint16_t peer_port_ = 0;

  void start() {
    port_ = free_port();
    peer_port_ = free_port();
    spawn();
  }
  void spawn() {
    const auto args = etcd_member_args(program(), "t", dir_.path(), port_, peer_port_,
                                       fmt::format("t=http://127.0.0.1:{}", peer_port_));
    const pid_t pid = kvstream::testing::spawn_service(args, dir_ / "etcd.out");
    if (pid < 0) return;
    // Ready when it answers a read (a new member elects itself within about a second).
    for (int i = 0; i < 100; ++i) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) return;  // exited: a port was taken
      if (cluster::current_members(config(), deadline_in(std::chrono::milliseconds(500))).ok()) {
        pid_ = pid;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

}  // namespace kvstream::transport::test_util

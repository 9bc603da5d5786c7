// An etcd cluster of several members for tests (etcd_server.hpp runs one): each member
// on two free loopback ports in its own directory, with short heartbeats and elections
// (100 ms, 500 ms) so that a member cut off from the majority finds itself without a
// leader within about a second. Stopped by PID on destruction. Tests skip when etcd is
// not installed.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kvstream/membership.hpp"
#include "tests/support/spawn_service.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/transport/etcd_server.hpp"
#include "tests/transport/free_port.hpp"

namespace kvstream::transport::test_util {

class EtcdMembers {
 public:
  /// Starts `n` members and waits until each of them answers a read; started() says
  /// whether they did. (Two answer once they have a leader; a third may still be
  /// joining then, and a member that has not published itself to the cluster accepts
  /// connections but answers nothing, so one left alone before that stays silent.)
  EtcdMembers(const std::string& tag, int n) : dir_(tag), members_(size_t(n)) {
    std::string initial;
    for (size_t i = 0; i < members_.size(); ++i) {
      members_[i].client_port = free_port();
      members_[i].peer_port = free_port();
      initial += fmt::format("{}m{}=http://127.0.0.1:{}", i ? "," : "", i, members_[i].peer_port);
    }
    initial_ = initial;
    for (size_t i = 0; i < members_.size(); ++i) spawn(i);
    size_t answered = 0;
    for (int t = 0; t < 100 && answered < members_.size(); ++t) {
      if (cluster::current_members(config({answered}), deadline_in(std::chrono::milliseconds(500))).ok()) ++answered;
      else std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ready_ = answered == members_.size();
  }
  ~EtcdMembers() {
    for (size_t i = 0; i < members_.size(); ++i) kill(i);
  }
  EtcdMembers(const EtcdMembers&) = delete;
  EtcdMembers& operator=(const EtcdMembers&) = delete;

  [[nodiscard]] bool started() const { return ready_; }
  [[nodiscard]] std::string url(size_t i) const {
    return fmt::format("http://127.0.0.1:{}", members_.at(i).client_port);
  }
  /// Stops member `i` at once (SIGKILL).
  void kill(size_t i) {
    Member& m = members_.at(i);
    if (m.pid <= 0) return;
    ::kill(m.pid, SIGKILL);
    ::waitpid(m.pid, nullptr, 0);
    m.pid = -1;
  }
  /// Freezes member `i` where it is (SIGSTOP: its connections stay open and silent,
  /// as on a member stuck on its disk), and lets it go on (SIGCONT).
  void pause(size_t i) {
    if (members_.at(i).pid > 0) ::kill(members_[i].pid, SIGSTOP);
  }
  void resume(size_t i) {
    if (members_.at(i).pid > 0) ::kill(members_[i].pid, SIGCONT);
  }
  /// Starts member `i` again on its ports and data.
  void restart(size_t i) {
    kill(i);
    spawn(i);
  }
  /// Membership settings with the members `order` as endpoints, in that order.
  [[nodiscard]] cluster::EtcdConfig config(const std::vector<size_t>& order,
                                           const std::string& prefix = "/kvs-test/") const {
    cluster::EtcdConfig c;
    for (size_t i : order) c.endpoints.push_back(url(i));
    c.prefix = prefix;
    return c;
  }

 private:
  struct Member {
    uint16_t client_port = 0, peer_port = 0;
    pid_t pid = -1;
  };
  kvstream::testing::TempDir dir_;
  std::vector<Member> members_;
  std::string initial_;
  bool ready_ = false;

  void spawn(size_t i) {
    const std::string name = fmt::format("m{}", i);
    auto args = etcd_member_args(EtcdServer::program(), name, dir_.path(), members_[i].client_port,
                                 members_[i].peer_port, initial_);
    for (const char* extra : {"--initial-cluster-state", "new", "--heartbeat-interval", "100", "--election-timeout", "500"})
      args.emplace_back(extra);
    members_[i].pid = kvstream::testing::spawn_service(args, dir_ / (name + ".out"));
  }
};

}  // namespace kvstream::transport::test_util

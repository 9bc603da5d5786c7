// Reads of the member set for a client that a node told its set is newer than the
// client's (members_link.hpp): the client's etcd watch is behind, and a chunk may have
// moved to a node it does not know yet. One read at a time on a thread of its own (a
// get's completion, and a node's answer that says so, run on a node connection's
// receiver, which must not wait on etcd); the calls that ask before a read begins
// share it, and reads begin at least `spacing` apart, so a burst of them costs etcd
// one read, not one each.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "kvstream/transport.hpp"

namespace kvstream::cluster {

class MemberCatchUp {
 public:
  /// Reads the set and applies it (MembershipWatch::catch_up) by the deadline; the
  /// token is cancelled when the catch-up stops.
  using Read = std::function<Status(transport::Deadline, const transport::CancelToken&)>;
  /// The revision the client's set is current as of (MembershipWatch::revision).
  using Revision = std::function<int64_t()>;
  /// Runs on the catch-up thread once a read that began after the request ended: ok,
  /// the read's error, or cancelled when the catch-up stops first.
  using Then = std::function<void(const Status&)>;

  /// `read` and `revision` are not called once stop() has returned.
  MemberCatchUp(Read read, Revision revision, transport::Clock::duration timeout, transport::Clock::duration spacing);
  /// Stops (stop()).
  ~MemberCatchUp();
  MemberCatchUp(const MemberCatchUp&) = delete;
  MemberCatchUp& operator=(const MemberCatchUp&) = delete;

  /// Asks for a read that begins after this call when a node `told` of a set newer
  /// than the client's; `then` runs after it. False (and `then` dropped) when the set
  /// is as new, or once stopping.
  bool request(int64_t told, Then then);

  /// As request() where no one waits for the read (it comes of an answer, or of a
  /// request, that said a set is newer: once per message): a nudge for a set no newer
  /// than one nudged before adds nothing, without a lock, and none queues a callback.
  /// After a failed read the next nudge asks again.
  void nudge(int64_t told);

  /// Ends the read in flight (its token) and answers the requests still waiting
  /// `cancelled`, on this thread; requests from here on are refused. Idempotent.
  void stop();

  /// The last read's error where it failed and ended less than `within` ago, else ok:
  /// a call that need not wait for a read (it can go on with the set it has) goes on
  /// at once while etcd does not answer, instead of waiting for each next read.
  [[nodiscard]] Status recent_failure(transport::Clock::duration within) const;

  /// Reads done so far (tests).
  [[nodiscard]] uint64_t reads() const;

 private:
  void run();

  Read read_;
  Revision revision_;
  transport::Clock::duration timeout_, spacing_;
  transport::CancelToken stop_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Then> waiting_;
  bool wanted_ = false;                // a nudge asked for a read (guarded by mu_)
  std::atomic<int64_t> nudged_{0};     // the newest set a nudge named since the last failed read
  bool stopping_ = false;
  transport::Clock::time_point last_start_{};
  transport::Clock::time_point last_failed_at_{};
  Status last_failure_;
  uint64_t reads_ = 0;
  std::thread thread_;
};

}  // namespace kvstream::cluster

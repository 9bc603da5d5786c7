// One RDM endpoint with its address vector and completion queue: posting tagged
// sends, receives and RMA reads, routing their completions to the operations that
// posted them, and the progress that reaps them (a progress thread, and every
// waiting call polling the queue itself).
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvstream/transport.hpp"
#include "transport/common/kept_head.hpp"
#include "transport/common/wait.hpp"
#include "transport/ofi/ofi_fabric.hpp"
#include "transport/ofi/ofi_peer_table.hpp"
#include "transport/ofi/ofi_strays.hpp"

namespace kvstream::transport::ofi {

/// One posted operation. The context handed to libfabric is the Op itself (fi_context2
/// first, so providers needing FI_CONTEXT/FI_CONTEXT2 get their scratch space).
struct Op {
  fi_context2 ctx{};
  std::atomic<bool> done{false};
  int err = 0;  // positive FI_E* value, 0 on success
  size_t len = 0;
  uint64_t tag = 0;
  std::shared_ptr<std::byte[]> buf;  // internal buffer (hello, header, bounce), if any
  size_t buf_size = 0;
  fid_mr* mr = nullptr;              // registration of buf where FI_MR_LOCAL is required
  bool counted = false;              // a send that keeps the progress thread busy until it completes
  bool quiet = false;                // the stray sweep's peek: no waiter watches it, and it is no work
  std::function<void(Op&)> on_complete;  // runs in whichever thread reaps the completion
  std::shared_ptr<void> keep;            // memory the provider may still write (a staged read's buffer)
  PeerTable::Use peer;                   // the peer it was posted to or from: its address stays in the vector
  ~Op();
};

/// A registered buffer that staged reads land in (Core::staged_reads), reused by a
/// connection's reads while no interrupted read still holds it.
struct Staging {
  std::unique_ptr<std::byte[]> buf;
  size_t size = 0;
  fid_mr* mr = nullptr;
  ~Staging();
};

/// The endpoint and its progress thread, which polls the completion queue while
/// sends are in flight (the provider's data progress is manual) and naps 1 ms between
/// polls otherwise. After kParkAfter without a completion it sleeps instead in the
/// kernel on the queue's wait fd, where the provider has one (tcp;ofi_rxm: FI_WAIT_FD;
/// fi_trywait, then poll(2) on it and an eventfd that sends kick); shm has none and
/// keeps napping. Any thread may post and poll, and a completion is routed to its Op
/// by context whichever thread reaps it. A waiting call polls the queue itself for its
/// first kParkAfter; then, on a blocking queue, it parks until the progress thread
/// routes the next completion (at most 5 ms, for cancels and for waits on other state)
/// instead of sleeping 200 us between polls. So an idle connection or listener costs
/// no polling (an idle storage node: 17% of a core before), while a busy one keeps
/// its latency: parking and sleeping in poll(2) at once made a 4 KiB ping-pong 3x as
/// slow (every event woke the progress thread, and a parked caller waited for it).
/// Every call into the provider on this endpoint (post, inject, cancel, address
/// insert, completion read, fi_trywait) is made under one lock (fi_mu_), although the
/// domain is FI_THREAD_SAFE: libfabric 1.17's shm provider, which declares that
/// level, lost a message in about 2 of 100 runs of a 12-message exchange while posts
/// ran beside another thread's completion reads (issue 19; the test
/// EveryMessageArrivesOnFreshConnections). The calls are short and never block (the
/// progress thread's poll(2) is outside the lock); the completion reads were
/// serialized already.
class Endpoint {
 public:
  /// Idle time after which the progress thread sleeps on the queue's fd and a
  /// waiting call parks (blocking queues only).
  static constexpr std::chrono::milliseconds kParkAfter{10};
  /// `shared`: many connections will use it (a listener's, or a client endpoint a
  /// backend shares), so no one connection may close it under the others.
  static Result<std::shared_ptr<Endpoint>> open(std::shared_ptr<Core> core, fi_info* info, bool shared = false);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  Core& core() { return *core_; }
  [[nodiscard]] bool shared() const { return shared_; }

  /// The endpoint's own address (fi_getname).
  Result<std::vector<unsigned char>> name();
  /// A use of the address vector's entry for the peer address `addr` (`len` bytes):
  /// inserted the first time, shared while anything uses it (ofi_peer_table.hpp).
  /// Unused entries are removed first, so a node's vector holds only the peers it
  /// serves. Errors: unavailable (fi_av_insert failed; an shm name this process
  /// closed: ofi_shm_local.hpp).
  Result<PeerTable::Use> peer(const void* addr, size_t len);
  /// Removes from the address vector the entries nothing uses any more (the progress
  /// thread does it too, whenever some wait).
  void remove_unused_peers();
  /// Entries in the address vector, after removing the unused ones.
  size_t peer_count();
  /// A peer's address as text, without the "fi_sockaddr_in://" scheme.
  std::string peer_name(const void* addr);

  std::shared_ptr<Op> new_op(size_t buf_size = 0);
  /// Registers op->buf when the provider needs local descriptors; returns the descriptor.
  Result<void*> local_desc(Op& op);
  /// At destruction, with staged reads: waits up to 200 ms for operations in flight;
  /// false (and the endpoint is left open, logged) when some never end.
  bool park_if_reads_linger();
  /// A staging buffer of at least `size` bytes, registered where FI_MR_LOCAL asks.
  Result<std::shared_ptr<Staging>> new_staging(size_t size);

  /// Posts a tagged receive (retrying while the provider says EAGAIN, until the
  /// deadline), of a message from `src` only where it is a peer's address
  /// (Core::directed_recv), else from anyone. Where the provider is ofi_rxm
  /// (Core::cleared_bodies), queued messages the receive would match that are larger
  /// than `keep_queued_up_to` (by default `len`: larger than the receive takes) are
  /// discarded first, counted as strays, in the same hold of the provider's lock: a
  /// large message is matched only on arrival, while its sender's connection is open.
  Status post_recv(const std::shared_ptr<Op>& op, void* buf, size_t len, void* desc, uint64_t tag, uint64_t ignore,
                   Deadline deadline, fi_addr_t src = FI_ADDR_UNSPEC,
                   std::optional<size_t> keep_queued_up_to = std::nullopt);
  /// Posts a tagged send from `buf` to `dest` (retrying while the provider says EAGAIN).
  Status post_send(const std::shared_ptr<Op>& op, const void* buf, size_t len, void* desc, fi_addr_t dest,
                   uint64_t tag, Deadline deadline, const CancelToken& cancel);
  /// Posts an RMA read of `len` bytes at the peer's `addr` under `key` into `buf`
  /// (retrying while the provider says EAGAIN, until the deadline or cancel).
  Status post_read(const std::shared_ptr<Op>& op, void* buf, size_t len, void* desc, fi_addr_t src, uint64_t addr,
                   uint64_t key, Deadline deadline, const CancelToken& cancel);

  /// One attempt at a tagged send (no retry): 0, -FI_EAGAIN (nothing posted) or
  /// another negative FI_E* error. The op is tracked and keeps the progress thread
  /// busy until its completion.
  ssize_t try_send(const std::shared_ptr<Op>& op, const void* buf, size_t len, void* desc, fi_addr_t dest,
                   uint64_t tag);
  /// One attempt at fi_tinject (no retry, no completion: the provider copies the data).
  ssize_t try_inject(const void* buf, size_t len, fi_addr_t dest, uint64_t tag);

  /// Waits (polling the CQ) until pred() holds. ok, timed_out or cancelled.
  template <typename Pred>
  Status wait(Pred pred, Deadline deadline, const CancelToken* cancel, std::string_view what) {
    uint64_t seen = 0;  // completions routed before this round's poll
    return poll_until(
        [&](bool& moved) -> std::optional<Status> {
          seen = completions_.load();
          moved = poll() > 0;
          sweep_when_due();
          if (pred()) return Status{};
          return std::nullopt;
        },
        deadline, cancel, "libfabric", what,
        [&](const Backoff& backoff) {
          if (wait_fd_ < 0 || !backoff.idle_for(kParkAfter)) return false;
          park(seen, deadline);
          return true;
        });
  }

  /// Asks the provider to cancel a posted operation (it may not support it for sends).
  void cancel(Op& op);
  /// Cancels a posted receive and waits for its completion (normal or FI_ECANCELED),
  /// so the provider no longer refers to its buffer. False if it never completed.
  bool cancel_and_drain(Op& op, std::chrono::milliseconds limit = std::chrono::seconds(10));

  /// Closes the endpoint now, with operations still posted: the provider drops them,
  /// so none of them touches its buffer afterwards (what an interrupted RMA read,
  /// which libfabric cannot cancel, needs). Only for an endpoint one connection owns.
  /// Every later post fails with unavailable.
  void close_now();

  /// One pass over the CQ; routes completions. Returns how many it handled.
  int poll();

  // ---- Strays (ofi_strays.hpp; the sweep is in ofi_strays.cpp) ----------------------

  /// Sweep pace: at most every kSweepEvery, by the progress thread (each of its passes
  /// while the endpoint is busy, each wake otherwise) or a call waiting on the
  /// endpoint, whichever comes first; the look behind a kept message once it has
  /// been first in line for kStuckAfter, at most every kLookBehindEvery
  /// (transport/common/kept_head.hpp; a peek per filter of stray_cover, under the
  /// provider's lock each).
  static constexpr std::chrono::milliseconds kSweepEvery{1};
  /// Strays dropped by one sweep at most: a caller that sweeps while it waits gets
  /// back to its own call.
  static constexpr size_t kMaxStraysPerSweep = 4096;

  struct ExpectSlot;
  /// A connection's hold on the messages under its id: while it lives, the sweep
  /// keeps what the connection will still receive. Made before the connection's id
  /// can reach its peer (a listener's before the hello-ack goes out). Moves only.
  class Expectation {
   public:
    Expectation() = default;
    Expectation(Expectation&& o) noexcept { *this = std::move(o); }
    Expectation& operator=(Expectation&& o) noexcept;
    Expectation(const Expectation&) = delete;
    Expectation& operator=(const Expectation&) = delete;
    ~Expectation() { release(); }
    explicit operator bool() const { return slot_ != nullptr; }
    /// The connection read every header before sequence `next`.
    void read_up_to(uint64_t next);

   private:
    friend class Endpoint;
    void release();
    Endpoint* ep_ = nullptr;
    std::shared_ptr<ExpectSlot> slot_;
  };
  /// The hold of connection `conn` on this endpoint.
  Expectation expect(uint32_t conn);
  /// The hold of a client's handshake under way (Expected::greeting), taken before
  /// its hello goes out and let go once its connection holds its id.
  Expectation expect_greeting();
  /// The endpoint listens: hellos and probes under any id are taken here.
  void set_listening();
  /// What the endpoint expects now (its open connections, whether it listens).
  Expected expected() const;
  /// Whether a message under exactly `tag` waits in the unexpected queue (a peek;
  /// false where the provider cannot peek).
  bool waiting(uint64_t tag);
  /// Strays dropped so far; nullopt where the provider cannot peek (shm).
  std::optional<Listener::Strays> strays() const;

  using Sweep = StraySweep;
  /// Drops the strays at the head of the unexpected queue; where a kept message is
  /// first in line and has been for `stuck_after`, and `look_behind`, also those
  /// behind it. One sweep at a time (the progress thread's, a waiting call's, or a
  /// test's).
  Sweep sweep_strays(bool look_behind, std::chrono::nanoseconds stuck_after = kStuckAfter);
  /// Whether the progress thread and waiting calls sweep (tests turn it off to sweep
  /// by hand).
  std::atomic<bool> auto_sweep{true};

 private:
  Endpoint(std::shared_ptr<Core> core, bool shared) : core_(std::move(core)), shared_(shared) {}
  Status init(fi_info* info);

  /// Makes one post (`attempt`: an fi_* call) until the provider takes it, retrying
  /// while it says EAGAIN (polling the CQ frees queue entries) until the deadline or a
  /// cancel. `call` names the fi_* function in errors, `what` the wait.
  template <typename Attempt>
  Status retry_post(Attempt attempt, std::string_view call, std::string_view what, Deadline deadline,
                    const CancelToken& cancel);

  /// Makes one call into the provider under fi_mu_ (see the class comment).
  template <typename Call>
  auto locked(Call&& call) {
    std::lock_guard lock(fi_mu_);
    return call();
  }

  /// A completion read off the queue under fi_mu_, routed (complete) after it.
  struct Reaped {
    void* context;
    int err;
    size_t len;
    uint64_t tag;
  };
  /// Completions read off the queue where they could not be routed (a post's guard,
  /// whose caller may hold locks the callbacks take): the next poll routes them.
  void defer(std::vector<Reaped>& got);
  std::mutex deferred_mu_;
  std::vector<Reaped> deferred_;  // deferred_mu_
  std::atomic<bool> has_deferred_{false};
  /// One read of the queue (up to 16 completions, or one error) into `out`; how many.
  int read_locked(std::vector<Reaped>& out);  // fi_mu_ held
  void route(const std::vector<Reaped>& got);

  void track(const std::shared_ptr<Op>& op);
  bool untrack(Op* op);
  void complete(void* context, int err, size_t len, uint64_t tag);
  void wake();
  void progress_loop();
  /// The progress thread's idle sleep on a blocking queue: fi_trywait, then poll(2)
  /// on the queue's fd and wake_fd_ for at most `limit`.
  void sleep_on_queue(std::chrono::milliseconds limit);
  /// A waiting call's sleep until a completion after the `seen`-th, the deadline, or
  /// 5 ms.
  void park(uint64_t seen, Deadline deadline);

  void remove_unused_peers_locked();  // av_mu_ held
  /// The bytes that name the peer at `addr` (`len` bytes) to the provider, as the
  /// table's key and what is inserted: a socket address with its padding zeroed, a
  /// string address up to its end, so that one peer is one entry however it wrote
  /// its address. invalid_argument where a socket address is too short.
  Result<std::string> address_key(const void* addr, size_t len) const;

  std::shared_ptr<Core> core_;
  const bool shared_;
  fid_ep* ep_ = nullptr;
  std::string shm_name_;  // the endpoint's own name where the provider is shm, remembered at close
  fid_av* av_ = nullptr;
  std::shared_ptr<PeerTable> peers_ = PeerTable::create();
  std::mutex av_mu_;  // held across each insert and removal, so that one address is never in the vector twice
  std::unordered_map<fi_addr_t, std::string> shm_holds_;  // entries naming shm endpoints of this process (av_mu_)
  fid_cq* cq_ = nullptr;
  std::mutex mu_;
  std::mutex fi_mu_;  // held for each fi_* call on ep_, av_ and cq_ (see the class comment)
  std::unordered_map<Op*, std::shared_ptr<Op>> inflight_;
  std::atomic<int> active_sends_{0};
  std::atomic<bool> stop_{false};
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  bool kick_ = false;
  int wait_fd_ = -1;                   // the queue's FI_WAIT_FD descriptor; -1: the progress thread naps
  int wake_fd_ = -1;                   // eventfd that wakes the progress thread from poll(2)
  std::atomic<bool> asleep_{false};    // the progress thread is (about to be) in poll(2)
  std::atomic<uint64_t> completions_{0};  // completions routed so far (parked waiters watch it)
  std::atomic<int> parked_{0};
  std::mutex park_mu_;
  std::condition_variable park_cv_;
  // Strays (ofi_strays.cpp).
  struct Peeked {
    uint64_t tag = 0;
    size_t len = 0;
  };
  /// The oldest waiting message matching (tag, ignore), left where it is; nullopt
  /// when none waits or the peek failed.
  std::optional<Peeked> peek(uint64_t tag, uint64_t ignore);
  /// Drops `p` (just peeked) if it is a stray by what the endpoint expects now: the
  /// discard's operation, whose completion counts it; nullptr where `p` is kept.
  std::shared_ptr<Op> drop_if_stray(const Peeked& p);
  /// Polls until `ops` completed (a bounded while; ofi_rxm completes them at once).
  void reap(std::vector<std::shared_ptr<Op>>& ops);
  /// A peek (FI_PEEK) posted at the first queued message matching (tag, ignore, src),
  /// and the queue read until its answer came (ofi_rxm answers within the call; 64
  /// reads at most). fi_mu_ held; what else was read is appended to `got`.
  struct PeekPost {
    std::shared_ptr<Op> op;  // tracked and quiet: routed with `got`
    ssize_t err = 0;         // the provider's, when the peek could not be posted
    std::optional<Reaped> answer;
  };
  PeekPost peek_locked(uint64_t tag, uint64_t ignore, fi_addr_t src, std::vector<Reaped>& got);
  /// Discards the queued messages matching (tag, ignore, src) while the first is
  /// larger than `keep` (post_recv's guard). fi_mu_ held; what it reads off the
  /// completion queue is appended to `got`, to be routed once the lock is let go.
  /// The provider's error, 0 when the queue is clear.
  ssize_t discard_oversized_locked(uint64_t tag, uint64_t ignore, fi_addr_t src, size_t keep,
                                   std::vector<Reaped>& got);
  /// A quiet operation whose completion counts a dropped stray of `len` bytes.
  std::shared_ptr<Op> stray_drop_op(size_t len);
  bool is_stray_now_locked(uint64_t tag) const;  // strays_mu_ held
  /// expected(), of connection `only` where given (unsorted then). strays_mu_ held.
  Expected expected_locked(std::optional<uint32_t> only) const;
  Sweep sweep_locked(bool look_behind, std::chrono::nanoseconds stuck_after = kStuckAfter);  // sweep_mu_ held
  /// A sweep at the pace above, by the progress thread or a caller waiting on the
  /// endpoint (either may be the one that reads a flood off the wire); none where
  /// another thread sweeps. The strays dropped.
  size_t sweep_when_due();

  std::atomic<bool> sweeps_{false};  // the provider answers FI_PEEK (ofi_rxm)
  mutable std::mutex strays_mu_;  // listening_, greetings_, expected_; held across a drop's discard call
  bool listening_ = false;
  int greetings_ = 0;  // handshakes under way (expect_greeting)
  std::unordered_multimap<uint32_t, std::shared_ptr<ExpectSlot>> expected_;
  std::atomic<uint64_t> strays_dropped_{0};
  std::atomic<uint64_t> stray_bytes_{0};
  std::mutex sweep_mu_;  // one sweep at a time; kept_head_, last_look_behind_
  KeptHead kept_head_;
  Clock::time_point last_look_behind_{};
  std::atomic<int64_t> last_sweep_ns_{0};  // steady clock
  std::thread progress_;
};

}  // namespace kvstream::transport::ofi

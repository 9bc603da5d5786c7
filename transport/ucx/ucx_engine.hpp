// The engine: a backend's one UCP worker, who progresses it and how a blocking call
// waits on it.
//
// Progress: each backend owns one ucp_worker (UCS_THREAD_MODE_SERIALIZED) guarded by
// one mutex (the context's) held only around UCX calls. A waiting call first checks
// whether it is already done, then progresses the worker itself (a spin of single
// progress calls, without pauses for the first 20 us, that lasts until 200 us pass
// without a call doing anything; then ucp_worker_arm + poll on the worker's event fd
// with <= 10 ms timeouts). Measuring the spin from the wait's start instead put a
// tcp receiver to sleep in the middle of a 1 MiB body, and the sender then paid a
// wakeup per segment. The spin yields the core only while that lets another task run
// (the peer often shares the core on small boxes); otherwise it busy-polls. The small
// message path reads no clock and takes the mutex once per call where it can: on this
// VM a clock read is ~25 ns and a shared-memory round trip ~0.45 us. A background
// thread progresses the worker while the application is idle (no call for 1 ms):
// without it a large send could never complete when the receiving process is not
// inside a recv call (UCX's rendezvous needs the receiver to make progress). It also
// stages bodies nobody receives yet (ucx_staging.cpp).
#pragma once

#include <ucp/api/ucp.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvstream/transport.hpp"
#include "transport/common/kept_head.hpp"
#include "transport/common/registration.hpp"
#include "transport/common/wait.hpp"
#include "transport/ucx/ucx_context.hpp"
#include "transport/ucx/ucx_request.hpp"
#include "transport/ucx/ucx_strays.hpp"

namespace kvstream::transport::ucx_detail {

struct ConnState;

class Engine {
 public:
  explicit Engine(std::shared_ptr<Context> c) : ctx(std::move(c)), mu(ctx->mu) {}
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();

  /// The context, the worker, its event fd, the hello handler and the background
  /// thread. Errors: those of Context::create; unavailable (UCX failed).
  static Result<std::shared_ptr<Engine>> create(const BackendConfig& config);

  std::shared_ptr<Context> ctx;
  ucp_worker_h worker = nullptr;
  int efd = -1;
  std::mutex& mu;  // the context's
  std::atomic<int> sleepers{0};
  std::atomic<int> waiters{0};
  /// Bumped by every application call (a plain store: no read-modify-write on the
  /// small-message path). While it moves, the background thread keeps off the worker
  /// (and its mutex): an application between two calls of a busy exchange would
  /// otherwise queue behind a background progress pass (futex waits at 1 MiB rates).
  std::atomic<uint32_t> activity{0};
  void touch() { activity.store(activity.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  bool peer_errors = true;  // UCP_ERR_HANDLING_MODE_PEER (UcxSettings::peer_errors = false turns it off)
  /// Hellos without a key, as a peer from before 2026-12-05 sends them (ucx_wire.hpp):
  /// set by tests of mixed versions, never by a configuration.
  bool keyless_hello = false;
  /// Whether the background thread sweeps strays (ucx_strays.hpp): turned off by tests
  /// that sweep with sweep_strays_locked themselves, never by a configuration.
  std::atomic<bool> auto_sweep{true};
  RegistrationCache cache;

  // Guarded by mu.
  uint32_t next_rx_id = 1;  // rx ids in order, where getrandom(2) fails (ucx_handshake.cpp)
  /// Header messages dropped for want of the connection's key (ucx_receive.cpp).
  uint64_t unkeyed_headers = 0;
  std::unordered_map<ucp_ep_h, ConnState*> by_ep;
  std::set<ConnState*> conns;
  /// Closed connections whose requests UCX did not finish: the requests still point
  /// into them, so they are freed only after the worker (and with it every request)
  /// is destroyed, and their rx ids are not handed out again.
  std::vector<std::shared_ptr<ConnState>> graveyard;
  size_t staged_bytes = 0;
  size_t stage_limit = 0;  // UcxSettings::stage_limit_bytes
  /// Stray messages received and dropped (ucx_strays.hpp), and their bytes as sent.
  uint64_t strays_dropped = 0;
  uint64_t stray_bytes = 0;
  /// A stray's receive that UCX did not finish at once (a rendezvous one, or an eager
  /// one whose fragments are still coming): its request writes into `op` and `buf`.
  struct StrayReceive {
    Op op;
    std::array<std::byte, 64> buf{};
  };
  std::vector<std::unique_ptr<StrayReceive>> stray_receives;
  /// Past this many unfinished stray receives a sweep waits for them to finish.
  static constexpr size_t kMaxStrayReceives = 256;
  /// Strays one sweep drops at most (about 1 ms of work here); a flood takes several.
  static constexpr size_t kMaxStraysPerSweep = 4096;

  /// Progresses until idle. Requires mu.
  void progress_locked() {
    unsigned n = 0;
    while (unsigned k = ucp_worker_progress(worker)) n += k;
    if (n && sleepers.load() > 0) ucp_worker_signal(worker);
  }

  /// One progress call; returns whether it did anything. Requires mu.
  bool progress_once_locked() {
    if (!ucp_worker_progress(worker)) return false;
    if (sleepers.load() > 0) ucp_worker_signal(worker);
    return true;
  }

  /// Waits until `pred` (called with mu held after progress) yields a Status, the
  /// deadline passes (timed_out) or `cancel` fires (cancelled): wait_verdict's rules,
  /// `who` and `what` naming the wait ("ucx 1.2.3.4:5", "recv_header").
  template <typename Pred>
  Status wait(Pred&& pred, Deadline deadline, const CancelToken* cancel, std::string_view who,
              std::string_view what) {
    // Counted as a waiter (the background thread then leaves progress to us) only
    // once we progress: a call that is done at once pays no atomic read-modify-write.
    Waiter waiter{waiters};
    touch();
    Spin spin;
    for (unsigned round = 0;; ++round) {
      std::unique_lock lk(mu);
      // Already there (a send that completed inline, a header that arrived while the
      // caller was busy): no progress call at all. Then one progress call per round,
      // not "until idle": a round trip's latency is the time from the peer's message
      // landing to the predicate seeing it, and a second call that finds nothing
      // only delays that.
      if (round == 0) {
        if (std::optional<Status> s = pred()) return std::move(*s);
        waiter.count();
      }
      spin.busy |= progress_once_locked();
      if (std::optional<Status> s = pred()) return std::move(*s);
      spin.tick(round);
      KVS_RETURN_IF_ERROR(wait_verdict(deadline, cancel, who, what, spin.now));
      if (spin.spinning()) {
        lk.unlock();
        spin.pause();
        continue;
      }
      sleep_on_event_fd(lk, deadline, spin.now);
    }
  }

  /// Waits for cleanup (cancelled requests, closing endpoints); bounded.
  template <typename Pred>
  bool wait_quiet(Pred&& pred, std::chrono::milliseconds limit) {
    Status s = wait([&]() -> std::optional<Status> { return pred() ? std::optional<Status>(Status{}) : std::nullopt; },
                    Clock::now() + limit, nullptr, "ucx", "cleanup");
    return s.ok();
  }

  /// Receives bodies nobody is receiving yet into staging buffers (ucx_staging.cpp).
  /// Requires mu. Returns true when some body may become due later.
  bool stage(Clock::time_point now);

  /// Receives and drops the stray messages waiting in the worker's unexpected queue
  /// (ucx_strays.hpp): the oldest ones for as long as they are strays, and with
  /// `look_behind`, when the oldest is a message kept for its connection that has
  /// been first in line for `stuck_after` (as earlier sweeps saw it), also those
  /// behind it (a probe per filter of stray_cover; the background thread does that at
  /// most once a second). Requires mu.
  using Sweep = transport::StraySweep;
  Sweep sweep_strays_locked(bool look_behind, Clock::duration stuck_after = transport::kStuckAfter);

 private:
  struct Waiter {
    std::atomic<int>& w;
    bool counted = false;
    void count() {
      if (!counted) w.fetch_add(1);
      counted = true;
    }
    ~Waiter() {
      if (counted) w.fetch_sub(1);
    }
  };

  /// The spinning half of a wait: when it ends and how it pauses between rounds.
  /// Busy-poll until kSpin passes without progress, then sleep on the event fd.
  /// While spinning, sched_yield only pays off when another task (often the peer)
  /// waits for this core: a yield that returns at once (nobody else runnable here)
  /// is followed by kYieldGap of pure spinning; one that took a while (another task
  /// ran) by yielding again next round, so that a peer sharing the core is not
  /// starved for a whole time slice.
  struct Spin {
    static constexpr auto kSpin = std::chrono::microseconds(200);       // without progress, then sleep
    static constexpr auto kEagerSpin = std::chrono::microseconds(20);   // polling without pauses
    static constexpr auto kFirstYield = std::chrono::microseconds(1);   // first sched_yield after this
    static constexpr auto kYieldGap = std::chrono::microseconds(5);     // then every kYieldGap ...
    static constexpr auto kYieldSwitched = std::chrono::microseconds(1);  // ... unless a yield ran another task

    Clock::time_point end{}, eager_end{}, next_yield{}, now{};
    bool busy = false;  // a progress call since the last clock read did something

    /// Reads the clock where this round needs it and moves the end of the spin.
    void tick(unsigned round) {
      // The clock is read every 16th round only while spinning: on a VM a read
      // costs about half a round, and a deadline is kept to within a microsecond
      // anyway. Past the spin (rounds that sleep) every round reads it.
      if (round % 16 != 0 && now < end) return;
      now = Clock::now();
      if (round == 0) {
        eager_end = now + kEagerSpin;
        next_yield = now + kFirstYield;
      }
      // The spin runs kSpin past the last round that moved something: a 1 MiB
      // body over tcp streams in for ~300 us, and a receiver that went to sleep
      // mid-body made the sender pay a wakeup per segment (15% of its time).
      if (busy || round == 0) end = now + kSpin;
      busy = false;
    }
    [[nodiscard]] bool spinning() const { return now < end; }

    /// Between two spinning rounds. For the first kEagerSpin no pause: a pause
    /// (~25 ns on Zen 4) only delays seeing a small message (0.53 -> 0.44 us
    /// shared-memory round trips). A longer wait is a bulk transfer's, and there a
    /// thread polling flat out takes execution units from the copy on the sibling
    /// hyperthread (shm bandwidth fell from ~11 to ~3.5 GB/s in some runs), so it
    /// pauses between rounds.
    void pause() {
      if (now >= next_yield) {
        std::this_thread::yield();
        const auto after = Clock::now();
        next_yield = after - now > kYieldSwitched ? after : after + kYieldGap;
      } else if (now >= eager_end) {
        for (int i = 0; i < 8; ++i) cpu_relax();
      }
    }

    static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      asm volatile("yield");
#endif
    }
  };

  /// Arms the worker and sleeps on its event fd (at most 10 ms, and not past the
  /// deadline); returns with `lk` released.
  void sleep_on_event_fd(std::unique_lock<std::mutex>& lk, Deadline deadline, Clock::time_point now);
  void background();
  /// The background thread's sweep, on each of its passes. Requires mu.
  void sweep_when_due(Clock::time_point now);
  /// What each open connection will still receive, by rx id. Requires mu.
  [[nodiscard]] std::vector<ExpectedSpace> open_spaces_locked() const;
  /// Takes the oldest waiting message matching `tag` under `mask` off the unexpected
  /// queue and receives it to be dropped; false when there is none. Requires mu.
  bool drop_stray_locked(uint64_t tag, uint64_t mask);

  Clock::time_point next_look_behind_{};
  transport::KeptHead kept_head_;

  std::thread bg_;
  std::atomic<bool> stop_{false};
};

/// Installs the handler of the peers' hello messages on the worker (ucx_handshake.cpp).
Status set_hello_handler(Engine& e);

}  // namespace kvstream::transport::ucx_detail

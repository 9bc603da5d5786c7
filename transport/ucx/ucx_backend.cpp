// UCX (UCP) transport backend.
//
// Wire format: every connection has, on each side, a receive tag space chosen by
// that side (rx_id, unique within its worker) and announced to the peer in a small
// "hello" active message sent on connect/accept (the AM handler learns the sending
// endpoint from reply_ep, which is how the two ends pair up; UCP tag matching is
// per worker, not per endpoint). A message is then
//   header: tag = peer_rx_id | kHeader | seq, payload = u64 body size + header bytes
//   body:   tag = peer_rx_id | kBody   | seq, payload = the body (absent when empty)
// so header and body of one message pair up and many messages can be in flight.
// A small body (header + body <= kMaxHeaderBytes) rides inside the header message
// instead (prefix bit 63 set; the body follows the header bytes; one message per
// round trip leg instead of two). Only where both engines are host-only: the hello
// carries a third word, flag kHelloInlineOk, and the copy is a memcpy.
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
// inside a recv call (UCX's rendezvous needs the receiver to make progress).
//
// Sends: post_send posts the header and body tag sends and returns a sequence number;
// the requests queue per connection (in order) and wait_sends reaps them. send() is
// post_send + wait_sends. An interrupted or failed wait_sends breaks the connection:
// outstanding sends are cancelled, and the endpoint force-closed when UCX cannot
// cancel them, before it returns (no request reads a caller's body afterwards).
//
// Error mode: endpoints use UCP_ERR_HANDLING_MODE_PEER (peer failure is detected).
// UCX 1.13 then leaves cma out; with the get_zcopy rendezvous scheme (set unless
// UCX_TLS is tcp alone) large shm messages go through the sysv FIFO (two copies) at
// 2-12 GB/s on the 2-vCPU VM, whole runs slow or fast, as ucx_perftest -e's do.
// BackendConfig::ucx.peer_errors = false trades failure detection (a dead peer may
// then surface only as a timeout) for cma.
//
// Receive staging: a body whose header has arrived but which the application has not
// started to receive within kStageGrace of the background thread first seeing that
// header (it looks every millisecond) is received by the background thread into a
// staging buffer (bounded by UcxSettings::stage_limit_bytes per backend), so a sender never waits
// forever on a receiver that reads later. Bodies received while the application is
// waiting go straight into the caller's buffer (no copy).
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <deque>

#include "core/log.hpp"
#include "transport/backends.hpp"
#include "transport/common/address.hpp"
#include "transport/common/registration.hpp"
#include "transport/common/wait.hpp"

namespace kvstream::transport {
namespace ucx_detail {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kHeaderKind = 1;
constexpr uint64_t kBodyKind = 2;
constexpr unsigned kHelloAmId = 7;
constexpr uint32_t kHelloMagic = 0x4b565543;  // "KVUC"
constexpr size_t kPrefix = 8;                 // u64 body size in front of the header bytes
constexpr size_t kHeaderRing = 32;            // header receives posted ahead per connection
constexpr auto kSpin = 200us;                 // spin without progress before sleeping on the event fd
constexpr auto kEagerSpin = 20us;             // polling without pauses (small-message latency)
constexpr auto kFirstYield = 1us;             // spinning: first sched_yield after this
constexpr auto kYieldGap = 5us;               // then every kYieldGap while yields return at once
constexpr auto kYieldSwitched = 1us;          // a yield this long ran another task: yield every round
constexpr uint64_t kInlineFlag = uint64_t(1) << 63;  // in the prefix: the body follows the header bytes
constexpr uint32_t kHelloInlineOk = 1;        // hello flag: this side accepts inline bodies (host-only)
constexpr auto kStageGrace = 2ms;
constexpr uint32_t kRxIdMask = 0xffffff;  // 24 bits of rx id, 8 of kind, 32 of sequence

uint64_t make_tag(uint32_t rx_id, uint64_t kind, uint32_t seq) {
  return (uint64_t(rx_id & kRxIdMask) << 40) | (kind << 32) | seq;
}

std::string sockaddr_to_string(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    return fmt::format("{}:{}", host, port);
  }
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    return fmt::format("[{}]:{}", host, port);
  }
  return "?";
}

/// One UCX request we wait for. Completion fields are written by callbacks, which run
/// inside ucp_worker_progress with the engine mutex held.
struct Op {
  void* req = nullptr;  // UCX request while pending
  bool done = true;
  ucs_status_t status = UCS_OK;
  size_t length = 0;
  ucp_tag_recv_info_t info{};

  void complete(ucs_status_t s) {
    done = true;
    status = s;  // no clock read here: it sits on every message's critical path
  }
  /// Takes the outcome of a *_nbx call. Returns false when it failed at once.
  bool track(ucs_status_ptr_t p) {
    if (p == nullptr) {
      complete(UCS_OK);
      length = info.length;
      return true;
    }
    if (UCS_PTR_IS_ERR(p)) {
      complete(UCS_PTR_STATUS(p));
      return false;
    }
    req = p;
    return true;
  }
  /// Frees the request of a completed op.
  void release() {
    if (req) ucp_request_free(req);
    req = nullptr;
  }
  void arm() {
    done = false;
    status = UCS_INPROGRESS;
    length = 0;
    req = nullptr;
  }
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void send_cb(void* /*request*/, ucs_status_t status, void* user) { static_cast<Op*>(user)->complete(status); }

void recv_cb(void* /*request*/, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* op = static_cast<Op*>(user);
  if (info) op->length = info->length;
  op->complete(status);
}

struct Context {
  ucp_context_h h = nullptr;
  /// Guards the context and its one worker (UCS_THREAD_MODE_SERIALIZED, and a
  /// context without UCP_PARAM_FIELD_MT_WORKERS_SHARED): every UCX call, including
  /// a registration's map and unmap, which touch state the worker's progress uses.
  /// It lives here, not in the engine, because regions may outlive the engine.
  std::mutex mu;
  ~Context() {
    if (h) ucp_cleanup(h);
  }
};

struct UcxRegion : MemoryRegion::Impl {
  std::shared_ptr<Context> ctx;
  ucp_mem_h memh = nullptr;
  ~UcxRegion() override {
    if (!memh) return;
    std::lock_guard lk(ctx->mu);
    ucp_mem_unmap(ctx->h, memh);
  }
  Result<std::vector<std::byte>> packed_key() const override {
    void* buf = nullptr;
    size_t len = 0;
    std::lock_guard lk(ctx->mu);
    const ucs_status_t st = ucp_rkey_pack(ctx->h, memh, &buf, &len);
    if (st != UCS_OK) return make_status(StatusCode::unavailable, "ucx: ucp_rkey_pack: {}", ucs_status_string(st));
    std::vector<std::byte> key(static_cast<std::byte*>(buf), static_cast<std::byte*>(buf) + len);
    ucp_rkey_buffer_release(buf);
    return key;
  }
};

class Engine;

/// Per-connection state, guarded by the engine mutex.
struct ConnState {
  Engine* eng = nullptr;
  ucp_ep_h ep = nullptr;
  std::string peer;
  std::string tls = "?";
  uint32_t rx_id = 0;
  uint32_t peer_rx_id = 0;
  bool hello = false;
  bool peer_inline_ok = false;  // the peer accepts small bodies inside the header message
  bool failed = false;
  bool closed = false;
  std::string fail_msg;
  uint32_t hello_out[3] = {kHelloMagic, 0, 0};
  Op hello_op;

  struct Slot {
    std::array<std::byte, kPrefix + kMaxHeaderBytes> buf;
    Op op;
    uint32_t seq = 0;
    Clock::time_point seen_at{};  // when staging first saw the header in (the grace starts there)
  };
  std::unique_ptr<std::array<Slot, kHeaderRing>> ring = std::make_unique<std::array<Slot, kHeaderRing>>();
  uint32_t rx_next = 0;
  // Header receives are reposted lazily: a consumed message's slot is reposted at the
  // next recv_header (the caller is about to wait anyway), not on the path from a
  // message's arrival to the caller's reply. Slots for [consumed, reposted) are posted.
  uint32_t consumed = 0;  // messages whose header and body are done
  uint32_t reposted = 0;  // next sequence number to post a header receive for
  bool body_pending = false;
  bool body_claimed = false;
  uint32_t body_seq = 0;
  size_t body_size = 0;
  bool body_inline = false;   // the pending body sits in its header slot
  size_t body_inline_off = 0;  // at this offset
  std::byte* body_posted_dest = nullptr;  // the pending inline body was already copied here

  struct Staged {
    std::unique_ptr<std::byte[]> buf;
    size_t size = 0;
    Op op;
  };
  std::map<uint32_t, std::unique_ptr<Staged>> staged;

  /// A body receive posted ahead by post_recv, straight into the caller's memory.
  struct Posted {
    std::byte* dest = nullptr;
    size_t capacity = 0;
    Op op;
  };
  std::map<uint32_t, std::unique_ptr<Posted>> posted;
  /// Peers' remote keys unpacked on this endpoint, by packed bytes (unpacking is not
  /// free: a reader of many chunks of one region unpacks once).
  std::map<std::string, ucp_rkey_h> rkeys;
  uint32_t post_next = 0;  // message the next post_recv covers (never behind rx_next)

  /// One posted message: header copy and the two send requests (stable addresses:
  /// callbacks write into them).
  struct Send {
    uint64_t seq = 0;
    size_t hlen = 0;
    std::array<std::byte, kPrefix + kMaxHeaderBytes> hbuf;
    Op hop, bop;
  };
  std::deque<std::unique_ptr<Send>> sends;  // posted, not yet reaped, in seq order
  uint64_t tx_next = 1;                     // sequence number of the next post_send
  uint64_t tx_reaped = 0;                   // every send <= this completed (and was freed)
  uint64_t tx_error_seq = 0;                // first send that failed (0: none)
  std::vector<std::unique_ptr<Send>> send_pool;  // reaped Sends for reuse

  Status failure() const {
    return make_status(StatusCode::unavailable, "ucx: {}", fail_msg.empty() ? "connection to " + peer + " failed" : fail_msg);
  }
};

void ep_error_cb(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* cs = static_cast<ConnState*>(arg);
  if (!cs->failed) {
    cs->failed = true;
    cs->fail_msg = fmt::format("peer {} failed: {}", cs->peer, ucs_status_string(status));
    KVS_LOG_DEBUG("ucx: {}", cs->fail_msg);
  }
}

struct ListenState {
  ucp_listener_h h = nullptr;
  std::deque<ucp_conn_request_h> pending;
};

void conn_cb(ucp_conn_request_h req, void* arg) { static_cast<ListenState*>(arg)->pending.push_back(req); }

class Engine {
 public:
  explicit Engine(std::shared_ptr<Context> c) : ctx(std::move(c)), mu(ctx->mu) {}
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
  std::string provider;
  bool cuda = false;
  bool peer_errors = true;  // UCP_ERR_HANDLING_MODE_PEER (BackendConfig::ucx.peer_errors = false turns it off)
  RegistrationCache cache;

  // Guarded by mu.
  uint32_t next_rx_id = 1;
  std::unordered_map<ucp_ep_h, ConnState*> by_ep;
  std::set<ConnState*> conns;
  std::vector<std::shared_ptr<ConnState>> graveyard;  // states whose requests did not finish
  size_t staged_bytes = 0;
  size_t stage_limit = 0;  // UcxSettings::stage_limit_bytes

  ~Engine() {
    stop_.store(true);
    if (worker) ucp_worker_signal(worker);
    if (bg_.joinable()) bg_.join();
    if (worker) ucp_worker_destroy(worker);
    graveyard.clear();
  }

  static Result<std::shared_ptr<Engine>> create(const BackendConfig& config) {
    auto e = std::make_shared<Engine>(std::make_shared<Context>());
    ucp_config_t* cfg = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
    if (st != UCS_OK) return make_status(StatusCode::unavailable, "ucx: ucp_config_read: {}", ucs_status_string(st));
    if (!config.ucx.tls.empty()) {
      st = ucp_config_modify(cfg, "TLS", config.ucx.tls.c_str());
      if (st != UCS_OK) {
        ucp_config_release(cfg);
        return make_status(StatusCode::invalid_argument, "ucx: bad ucx_tls '{}': {}", config.ucx.tls,
                           ucs_status_string(st));
      }
      e->provider = "UCX_TLS=" + config.ucx.tls;
    } else if (const char* env = std::getenv("UCX_TLS"); env && *env) {
      e->provider = std::string("UCX_TLS=") + env;
    } else {
      e->provider = "UCX default";
    }
    // Endpoints use UCP_ERR_HANDLING_MODE_PEER; UCX 1.13 leaves the shared memory
    // transports out of such endpoints unless MM_ERROR_HANDLING is on (UCX issue #8477).
    // A tcp-only UCX has no shared memory (and warns about the setting): left alone.
    std::string tls = config.ucx.tls;
    if (tls.empty())
      if (const char* env = std::getenv("UCX_TLS")) tls = env;
    const bool tcp_only = tls == "tcp";
    e->peer_errors = config.ucx.peer_errors;
    e->stage_limit = size_t(config.ucx.stage_limit_bytes);
    if (e->peer_errors && !tcp_only && !std::getenv("UCX_MM_ERROR_HANDLING") &&
        ucp_config_modify(cfg, "MM_ERROR_HANDLING", "y") != UCS_OK)
      KVS_LOG_DEBUG("ucx: MM_ERROR_HANDLING is not a setting of this UCX");
    // Rendezvous: with peer error handling UCX 1.13 keeps cma out, and its default
    // scheme then adds a tcp lane for large shared-memory messages (~5 GB/s here, and
    // an epoll_wait in every progress call: 3.5 us round trips instead of 1.0).
    // get_zcopy keeps such endpoints on shared memory alone (~10 GB/s, 1.0 us). Over
    // tcp alone it is slower (3.4 vs 4.4 GB/s), so a tcp-only UCX keeps the default.
    // UCX_RNDV_SCHEME in the environment wins.
    if (!tcp_only && !std::getenv("UCX_RNDV_SCHEME") && ucp_config_modify(cfg, "RNDV_SCHEME", "get_zcopy") != UCS_OK)
      KVS_LOG_DEBUG("ucx: RNDV_SCHEME is not a setting of this UCX");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    st = ucp_init(&params, cfg, &e->ctx->h);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
      e->ctx->h = nullptr;
      return make_status(StatusCode::unavailable, "ucx: ucp_init ({}): {}", e->provider, ucs_status_string(st));
    }
    ucp_context_attr_t cattr{};
    cattr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (ucp_context_query(e->ctx->h, &cattr) == UCS_OK)
      e->cuda = (cattr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    if (config.memory == MemoryType::cuda && !e->cuda)
      return make_status(StatusCode::unsupported,
                         "ucx: cuda memory requested but this UCX ({}) has no cuda transport (no cuda memory type)",
                         e->provider);

    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    st = ucp_worker_create(e->ctx->h, &wp, &e->worker);
    if (st != UCS_OK) {
      e->worker = nullptr;
      return make_status(StatusCode::unavailable, "ucx: ucp_worker_create: {}", ucs_status_string(st));
    }
    st = ucp_worker_get_efd(e->worker, &e->efd);
    if (st != UCS_OK) return make_status(StatusCode::unavailable, "ucx: ucp_worker_get_efd: {}", ucs_status_string(st));
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = kHelloAmId;
    am.cb = &Engine::hello_cb;
    am.arg = e.get();
    st = ucp_worker_set_am_recv_handler(e->worker, &am);
    if (st != UCS_OK)
      return make_status(StatusCode::unavailable, "ucx: ucp_worker_set_am_recv_handler: {}", ucs_status_string(st));
    e->bg_ = std::thread([raw = e.get()] { raw->background(); });
    return e;
  }

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
  /// deadline passes (timed_out) or `cancel` fires (cancelled).
  /// `what` and `peer` only name the operation in errors ("recv_header from" + peer).
  template <typename Pred>
  Status wait(Pred&& pred, Deadline deadline, const CancelToken* cancel, const char* what,
              const std::string& peer = {}) {
    // Counted as a waiter (the background thread then leaves progress to us) only
    // once we progress: a call that is done at once pays no atomic read-modify-write.
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
    } waiter{waiters};
    touch();
    const char* sep = peer.empty() ? "" : " ";
    // Busy-poll until kSpin passes without progress, then sleep on the event fd.
    // While spinning, sched_yield only pays off when another task (often the peer)
    // waits for this core: a yield that returns at once (nobody else runnable here)
    // is followed by kYieldGap of pure spinning; one that took a while (another task
    // ran) by yielding again next round, so that a peer sharing the core is not
    // starved for a whole time slice.
    Clock::time_point spin_end{}, eager_end{}, next_yield{}, now{};
    bool busy = false;  // a progress call since the last clock read did something
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
      busy |= progress_once_locked();
      if (std::optional<Status> s = pred()) return std::move(*s);
      if (cancel && cancel->cancelled())
        return make_status(StatusCode::cancelled, "ucx: {}{}{} cancelled", what, sep, peer);
      // The clock is read every 16th round only while spinning: on a VM a read
      // costs about half a round, and a deadline is kept to within a microsecond
      // anyway. Past the spin (rounds that sleep) every round reads it.
      if (round % 16 == 0 || now >= spin_end) {
        now = Clock::now();
        if (round == 0) {
          eager_end = now + kEagerSpin;
          next_yield = now + kFirstYield;
        }
        // The spin runs kSpin past the last round that moved something: a 1 MiB
        // body over tcp streams in for ~300 us, and a receiver that went to sleep
        // mid-body made the sender pay a wakeup per segment (15% of its time).
        if (busy || round == 0) spin_end = now + kSpin;
        busy = false;
      }
      if (now >= deadline) return make_status(StatusCode::timed_out, "ucx: {}{}{} timed out", what, sep, peer);
      if (now < spin_end) {
        lk.unlock();
        // For the first kEagerSpin no pause between rounds: a pause (~25 ns on
        // Zen 4) only delays seeing a small message (0.53 -> 0.44 us shared-memory
        // round trips). A longer wait is a bulk transfer's, and there a thread
        // polling flat out takes execution units from the copy on the sibling
        // hyperthread (shm bandwidth fell from ~11 to ~3.5 GB/s in some runs), so
        // it pauses between rounds.
        if (now >= next_yield) {
          std::this_thread::yield();
          const auto after = Clock::now();
          next_yield = after - now > kYieldSwitched ? after : after + kYieldGap;
        } else if (now >= eager_end) {
          for (int i = 0; i < 8; ++i) cpu_relax();
        }
        continue;
      }
      sleepers.fetch_add(1);
      const ucs_status_t st = ucp_worker_arm(worker);
      lk.unlock();
      if (st == UCS_OK) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
        pollfd p{efd, POLLIN, 0};
        ::poll(&p, 1, int(std::clamp<int64_t>(left, 0, 10)));
      }
      sleepers.fetch_sub(1);
    }
  }

  /// Waits for cleanup (cancelled requests, closing endpoints); bounded.
  template <typename Pred>
  bool wait_quiet(Pred&& pred, std::chrono::milliseconds limit) {
    Status s = wait([&]() -> std::optional<Status> { return pred() ? std::optional<Status>(Status{}) : std::nullopt; },
                    Clock::now() + limit, nullptr, "cleanup");
    return s.ok();
  }

  uint32_t alloc_rx_id() {
    for (;;) {
      uint32_t id = next_rx_id++ & kRxIdMask;
      if (id == 0) continue;
      bool used = false;
      for (auto* c : conns) used |= c->rx_id == id;
      if (!used) return id;
    }
  }

  /// Posts the header receive for `seq` into its ring slot. Requires mu.
  void post_header(ConnState& cs, uint32_t seq) {
    auto& slot = (*cs.ring)[seq % kHeaderRing];
    slot.seq = seq;
    slot.seen_at = {};
    slot.op.arm();
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO |
                     UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // 1.13 leaves tag_info unset on immediate completion
    p.cb.recv = recv_cb;
    p.user_data = &slot.op;
    p.recv_info.tag_info = &slot.op.info;
    slot.op.track(ucp_tag_recv_nbx(worker, slot.buf.data(), slot.buf.size(), make_tag(cs.rx_id, kHeaderKind, seq),
                                   ~uint64_t(0), &p));
  }

  /// Reposts the header receives of consumed messages. Requires mu.
  void repost_headers(ConnState& cs) {
    while (int32_t(cs.consumed + uint32_t(kHeaderRing) - cs.reposted) > 0) post_header(cs, cs.reposted++);
  }

  /// Receives bodies nobody is receiving yet into staging buffers. Requires mu.
  /// Returns true when some body may become due later.
  bool stage(Clock::time_point now) {
    bool later = false;
    for (ConnState* cs : conns) {
      if (cs->failed || cs->closed || !cs->hello) continue;
      auto consider = [&](uint32_t seq, size_t size, Clock::time_point arrived) {
        if (size == 0 || cs->staged.count(seq) || cs->posted.count(seq)) return;
        if (now < arrived + kStageGrace) {
          later = true;
          return;
        }
        if (staged_bytes + size > stage_limit) return;  // the sender waits for the reader
        auto st = std::make_unique<ConnState::Staged>();
        st->buf.reset(new std::byte[size]);
        st->size = size;
        st->op.arm();
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO |
                     UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // 1.13 leaves tag_info unset on immediate completion
        p.cb.recv = recv_cb;
        p.user_data = &st->op;
        p.recv_info.tag_info = &st->op.info;
        st->op.track(
            ucp_tag_recv_nbx(worker, st->buf.get(), size, make_tag(cs->rx_id, kBodyKind, seq), ~uint64_t(0), &p));
        staged_bytes += size;
        cs->staged.emplace(seq, std::move(st));
      };
      auto seen = [&](ConnState::Slot& slot) {
        if (slot.seen_at == Clock::time_point{}) slot.seen_at = now;
        return slot.seen_at;
      };
      if (cs->body_pending && !cs->body_claimed && !cs->body_inline) {
        auto& slot = (*cs->ring)[(cs->body_seq) % kHeaderRing];
        consider(cs->body_seq, cs->body_size, seen(slot));
      }
      for (uint32_t i = 0; i < kHeaderRing; ++i) {
        const uint32_t seq = cs->rx_next + i;
        auto& slot = (*cs->ring)[seq % kHeaderRing];
        if (slot.seq != seq || !slot.op.done || slot.op.status != UCS_OK || slot.op.length < kPrefix) break;
        uint64_t size;
        std::memcpy(&size, slot.buf.data(), kPrefix);
        if (size & kInlineFlag) continue;  // nothing left on the wire
        consider(seq, size_t(size), seen(slot));
      }
    }
    return later;
  }

 private:
  std::thread bg_;
  std::atomic<bool> stop_{false};

  static ucs_status_t hello_cb(void* arg, const void* /*header*/, size_t /*header_length*/, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* e = static_cast<Engine*>(arg);
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || length < 8 ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
      return UCS_OK;
    uint32_t msg[3] = {0, 0, 0};
    std::memcpy(msg, data, std::min(length, sizeof msg));
    auto it = e->by_ep.find(param->reply_ep);
    if (msg[0] != kHelloMagic || it == e->by_ep.end()) {
      KVS_LOG_WARN("ucx: ignoring an unexpected hello message");
      return UCS_OK;
    }
    it->second->peer_rx_id = msg[1];
    it->second->peer_inline_ok = (msg[2] & kHelloInlineOk) != 0;
    it->second->hello = true;
    return UCS_OK;
  }

  void background() {
    uint32_t seen = activity.load(std::memory_order_relaxed);
    while (!stop_.load()) {
      const uint32_t act = activity.load(std::memory_order_relaxed);
      if (waiters.load() > 0 || act != seen) {
        seen = act;
        // A caller is progressing the worker, or was active within the last
        // millisecond: only look for bodies to stage. try_lock: never make a caller
        // queue behind us.
        if (std::unique_lock lk(mu, std::try_to_lock); lk.owns_lock()) stage(Clock::now());
        std::this_thread::sleep_for(1ms);
        continue;
      }
      std::unique_lock lk(mu);
      progress_locked();
      const bool later = stage(Clock::now());
      const ucs_status_t st = ucp_worker_arm(worker);
      lk.unlock();
      if (st == UCS_ERR_BUSY) continue;
      pollfd p{efd, POLLIN, 0};
      ::poll(&p, 1, later ? 1 : 10);
    }
  }
};

std::string ep_transports(ucp_ep_h ep) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (!f) return "?";
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string text(buf, len);
  std::free(buf);
  // Lane lines look like "lane[0]:  1:tcp/lo.0 md[1] ..."; collect the transport names.
  std::vector<std::string> tls;
  size_t pos = 0;
  while ((pos = text.find("lane[", pos)) != std::string::npos) {
    const size_t eol = text.find('\n', pos);
    const std::string line = text.substr(pos, eol == std::string::npos ? std::string::npos : eol - pos);
    pos = eol == std::string::npos ? text.size() : eol;
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    size_t b = slash;
    while (b > 0 && (std::isalnum(static_cast<unsigned char>(line[b - 1])) || line[b - 1] == '_')) --b;
    const std::string tl = line.substr(b, slash - b);
    if (!tl.empty() && std::find(tls.begin(), tls.end(), tl) == tls.end()) tls.push_back(tl);
  }
  return tls.empty() ? std::string("?") : fmt::format("{}", fmt::join(tls, ","));
}

class UcxConnection final : public Connection {
 public:
  UcxConnection(std::shared_ptr<Engine> eng, std::shared_ptr<ConnState> cs)
      : eng_(std::move(eng)), cs_(std::move(cs)) {}

  ~UcxConnection() override { close_conn(*eng_, cs_); }

  /// Closes the endpoint, cancels receives and waits (bounded) for every request.
  static void close_conn(Engine& eng, const std::shared_ptr<ConnState>& cs) {
    Op close_op;
    {
      std::lock_guard lk(eng.mu);
      cs->closed = true;
      for (auto& slot : *cs->ring)
        if (!slot.op.done && slot.op.req) ucp_request_cancel(eng.worker, slot.op.req);
      for (auto& [seq, st] : cs->staged)
        if (!st->op.done && st->op.req) ucp_request_cancel(eng.worker, st->op.req);
      for (auto& [seq, po] : cs->posted)
        if (!po->op.done && po->op.req) ucp_request_cancel(eng.worker, po->op.req);
      destroy_rkeys_locked(*cs);  // before the endpoint they were unpacked on goes
      if (cs->ep) {
        // Sends posted but never waited for: flushed by the graceful close below.
        close_op.arm();
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
        p.cb.send = send_cb;
        p.user_data = &close_op;
        p.flags = cs->failed ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        close_op.track(ucp_ep_close_nbx(cs->ep, &p));
      }
    }
    auto all_done = [&] {
      if (!close_op.done || !cs->hello_op.done) return false;
      for (auto& slot : *cs->ring)
        if (!slot.op.done) return false;
      for (auto& [seq, st] : cs->staged)
        if (!st->op.done) return false;
      for (auto& [seq, po] : cs->posted)
        if (!po->op.done) return false;
      for (auto& snd : cs->sends)
        if (!snd->hop.done || !snd->bop.done) return false;
      return true;
    };
    bool ok = eng.wait_quiet(all_done, 2s);
    std::lock_guard lk(eng.mu);
    if (!ok && !close_op.done && close_op.req) {
      // A graceful close that did not finish: let UCX free it when it completes.
      ucp_request_free(close_op.req);
      close_op.req = nullptr;
      close_op.done = true;
    }
    close_op.release();
    cs->hello_op.release();
    for (auto& slot : *cs->ring) slot.op.release();
    for (auto& snd : cs->sends) {
      snd->hop.release();
      snd->bop.release();
    }
    for (auto& [seq, st] : cs->staged) {
      st->op.release();
      eng.staged_bytes -= st->size;
    }
    cs->staged.clear();
    if (ok) {
      for (auto& [seq, po] : cs->posted) po->op.release();
      cs->posted.clear();
    }
    eng.by_ep.erase(cs->ep);
    eng.conns.erase(cs.get());
    if (!ok) {
      KVS_LOG_WARN("ucx: connection to {} did not close cleanly", cs->peer);
      eng.graveyard.push_back(cs);  // requests may still point into it
    }
  }

  /// Frees completed sends at the front of the queue. Requires mu.
  void reap_locked() {
    auto& q = cs_->sends;
    while (!q.empty() && q.front()->hop.done && q.front()->bop.done) {
      auto snd = std::move(q.front());
      q.pop_front();
      snd->hop.release();
      snd->bop.release();
      const ucs_status_t st = snd->hop.status != UCS_OK ? snd->hop.status : snd->bop.status;
      if (st != UCS_OK && cs_->tx_error_seq == 0) {
        cs_->tx_error_seq = snd->seq;
        if (!cs_->failed) {
          cs_->failed = true;
          cs_->fail_msg = fmt::format("send to {} failed: {}", cs_->peer, ucs_status_string(st));
        }
      }
      cs_->tx_reaped = snd->seq;
      if (cs_->send_pool.size() < 64) cs_->send_pool.push_back(std::move(snd));
    }
  }

  /// Closes the endpoint at once: every request on it completes (with an error), so
  /// none can touch a caller's buffer afterwards. Requires mu.
  void force_close_locked() {
    destroy_rkeys_locked(*cs_);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(cs_->ep, &p);
    if (r && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
    eng_->by_ep.erase(cs_->ep);
    cs_->ep = nullptr;
  }

  static void destroy_rkeys_locked(ConnState& cs) {
    for (auto& [key, rkey] : cs.rkeys) ucp_rkey_destroy(rkey);
    cs.rkeys.clear();
  }

  [[nodiscard]] bool sends_done_locked() const {
    for (const auto& snd : cs_->sends)
      if (!snd->hop.done || !snd->bop.done) return false;
    return true;
  }

  /// After an interrupted or failed wait_sends: the connection is broken; cancels
  /// every outstanding send and, when UCX cannot cancel it, force-closes the endpoint,
  /// so that no request reads a caller's buffer after we return.
  void abort_sends(const Status& why) {
    Engine& e = *eng_;
    {
      std::lock_guard lk(e.mu);
      if (!cs_->failed) {
        cs_->failed = true;
        cs_->fail_msg = fmt::format("connection to {} unusable after an interrupted send ({})", cs_->peer,
                                    why.message());
      }
      for (auto& snd : cs_->sends) {
        if (!snd->hop.done && snd->hop.req) ucp_request_cancel(e.worker, snd->hop.req);
        if (!snd->bop.done && snd->bop.req) ucp_request_cancel(e.worker, snd->bop.req);
      }
    }
    if (!e.wait_quiet([&] { return sends_done_locked(); }, 200ms)) {
      std::lock_guard lk(e.mu);
      if (cs_->ep && !sends_done_locked()) force_close_locked();
    }
    if (!e.wait_quiet([&] { return sends_done_locked(); }, 5s))
      KVS_LOG_ERROR("ucx: a send request to {} did not complete after cancel", cs_->peer);
    std::lock_guard lk(e.mu);
    reap_locked();
  }

  Result<uint64_t> post_send(std::span<const std::byte> header, std::span<const std::byte> body) override {
    if (header.size() > kMaxHeaderBytes)
      return make_status(StatusCode::invalid_argument, "ucx: header of {} bytes exceeds {}", header.size(),
                         kMaxHeaderBytes);
    Engine& e = *eng_;
    e.touch();
    std::lock_guard lk(e.mu);
    reap_locked();
    if (cs_->failed || !cs_->ep) return cs_->failure();
    std::unique_ptr<ConnState::Send> snd;
    if (!cs_->send_pool.empty()) {
      snd = std::move(cs_->send_pool.back());
      cs_->send_pool.pop_back();
    } else {
      snd = std::make_unique<ConnState::Send>();
    }
    snd->seq = cs_->tx_next++;
    const auto wire_seq = uint32_t(snd->seq - 1);  // the receiver's ring starts at 0
    // A small body travels in the header message (one message instead of two; the
    // receiver copies it out of its header slot). Only between host-only engines.
    const bool inl = !body.empty() && cs_->peer_inline_ok && !e.cuda && header.size() + body.size() <= kMaxHeaderBytes;
    const uint64_t body_size = body.size() | (inl ? kInlineFlag : 0);
    std::memcpy(snd->hbuf.data(), &body_size, kPrefix);
    if (!header.empty()) std::memcpy(snd->hbuf.data() + kPrefix, header.data(), header.size());
    snd->hlen = kPrefix + header.size();
    if (inl) {
      std::memcpy(snd->hbuf.data() + snd->hlen, body.data(), body.size());
      snd->hlen += body.size();
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = send_cb;
    snd->hop.arm();
    snd->bop.arm();
    snd->bop.complete(UCS_OK);
    p.user_data = &snd->hop;
    bool ok = snd->hop.track(
        ucp_tag_send_nbx(cs_->ep, snd->hbuf.data(), snd->hlen, make_tag(cs_->peer_rx_id, kHeaderKind, wire_seq), &p));
    if (ok && !body.empty() && !inl) {
      snd->bop.arm();
      p.user_data = &snd->bop;
      ok = snd->bop.track(
          ucp_tag_send_nbx(cs_->ep, body.data(), body.size(), make_tag(cs_->peer_rx_id, kBodyKind, wire_seq), &p));
    }
    const uint64_t seq = snd->seq;
    const ucs_status_t st = snd->hop.status != UCS_OK && snd->hop.done ? snd->hop.status : snd->bop.status;
    cs_->sends.push_back(std::move(snd));
    if (!ok) {
      // Half a message may be on the wire: the stream is unusable from here on.
      if (!cs_->failed) {
        cs_->failed = true;
        cs_->fail_msg = fmt::format("send to {} failed: {}", cs_->peer, ucs_status_string(st));
      }
      reap_locked();
      return cs_->failure();
    }
    return seq;
  }

  Status wait_sends(uint64_t seq, Deadline deadline, const CancelToken& cancel) override {
    Engine& e = *eng_;
    {
      std::lock_guard lk(e.mu);
      if (seq >= cs_->tx_next)
        return make_status(StatusCode::invalid_argument, "ucx: wait_sends({}) but only {} sends were posted", seq,
                           cs_->tx_next - 1);
      // A small send usually completed inside its post: done without entering the
      // wait (~50 ns of a 0.45 us shared-memory round trip).
      reap_locked();
      if (cs_->tx_reaped >= seq && (cs_->tx_error_seq == 0 || cs_->tx_error_seq > seq)) return {};
    }
    Status s = e.wait(
        [&]() -> std::optional<Status> {
          reap_locked();
          if (cs_->tx_error_seq != 0 && cs_->tx_error_seq <= seq) return cs_->failure();
          if (cs_->tx_reaped >= seq) return Status{};
          if (cs_->failed) return cs_->failure();
          return std::nullopt;
        },
        deadline, &cancel, "send to", cs_->peer);
    if (!s.ok()) abort_sends(s);
    return s;
  }

  Result<size_t> recv_header(std::vector<std::byte>& header, Deadline deadline, const CancelToken& cancel) override {
    Engine& e = *eng_;
    // Everything happens in the wait's predicate, under the lock the wait holds anyway
    // (one lock per call on the small-message path): the first call reposts consumed
    // header slots, or asks for the previous message's unread body to be dropped.
    Result<size_t> out{size_t(0)};
    for (;;) {
      bool prepared = false, drop_body = false;
      Status s = e.wait(
          [&]() -> std::optional<Status> {
            if (!prepared) {
              if (cs_->body_pending) {
                drop_body = true;
                return Status{};
              }
              e.repost_headers(*cs_);
              prepared = true;
            }
            const auto& slot = (*cs_->ring)[cs_->rx_next % kHeaderRing];
            if (slot.op.done) {
              out = take_header_locked(header);
              return Status{};
            }
            if (cs_->failed) return cs_->failure();
            return std::nullopt;
          },
          deadline, &cancel, "recv_header from", cs_->peer);
      if (!s.ok()) return s;
      if (!drop_body) return out;
      KVS_RETURN_IF_ERROR(recv_body({}, deadline, cancel));  // the previous body was not read: drop it
    }
  }

  /// Takes the arrived header of message rx_next. Requires mu.
  Result<size_t> take_header_locked(std::vector<std::byte>& header) {
    Engine& e = *eng_;
    auto& slot = (*cs_->ring)[cs_->rx_next % kHeaderRing];
    slot.op.release();
    if (slot.op.status != UCS_OK) {
      if (cs_->failed) return cs_->failure();
      return make_status(StatusCode::unavailable, "ucx: receive from {} failed: {}", cs_->peer,
                         ucs_status_string(slot.op.status));
    }
    if (slot.op.length < kPrefix)
      return make_status(StatusCode::corrupt_data, "ucx: message header of {} bytes from {}", slot.op.length, cs_->peer);
    uint64_t body_size;
    std::memcpy(&body_size, slot.buf.data(), kPrefix);
    const bool inl = (body_size & kInlineFlag) != 0;
    body_size &= ~kInlineFlag;
    size_t hend = slot.op.length;
    if (inl) {
      if (body_size == 0 || body_size > slot.op.length - kPrefix)
        return make_status(StatusCode::corrupt_data, "ucx: message of {} bytes from {} announces {} inline body bytes",
                           slot.op.length, cs_->peer, body_size);
      hend -= size_t(body_size);
    }
    header.assign(slot.buf.data() + kPrefix, slot.buf.data() + hend);
    const uint32_t seq = cs_->rx_next++;
    cs_->body_inline = inl;
    cs_->body_inline_off = hend;
    cs_->body_pending = body_size > 0;
    cs_->body_claimed = false;
    cs_->body_seq = seq;
    cs_->body_size = size_t(body_size);
    // Keep seen_at of this slot for staging decisions until the body is read; its
    // next receive is posted once the body is done (slot reuse is seq + kHeaderRing).
    if (!cs_->body_pending) cs_->consumed = seq + 1;
    if (auto it = cs_->posted.find(seq); it != cs_->posted.end() && (inl || body_size == 0)) {
      // No body message will come for this post: withdraw it (an unmatched receive
      // completes at once on cancel).
      ConnState::Posted& po = *it->second;
      if (!po.op.done && po.op.req) ucp_request_cancel(e.worker, po.op.req);
      if (!po.op.done) {
        KVS_LOG_ERROR("ucx: a receive posted for message {} from {} did not cancel", seq, cs_->peer);
        return make_status(StatusCode::internal, "ucx: a posted receive did not cancel");
      }
      if (inl && po.dest && body_size <= po.capacity) {
        // Honour the post: the body lands where the caller asked.
        std::memcpy(po.dest, slot.buf.data() + hend, size_t(body_size));
        cs_->body_posted_dest = po.dest;
      }
      po.op.release();
      cs_->posted.erase(it);
    }
    return size_t(body_size);
  }

  Status post_recv(std::span<std::byte> dest) override {
    Engine& e = *eng_;
    e.touch();
    std::lock_guard lk(e.mu);
    if (cs_->failed) return cs_->failure();
    if (int32_t(cs_->rx_next - cs_->post_next) > 0) cs_->post_next = cs_->rx_next;
    const uint32_t seq = cs_->post_next;
    if (uint32_t(seq - cs_->rx_next) >= (uint32_t(1) << 30))
      return make_status(StatusCode::resource_exhausted, "ucx: too many receives posted ahead");
    cs_->post_next++;
    if (dest.empty()) return {};
    auto po = std::make_unique<ConnState::Posted>();
    po->dest = dest.data();
    po->capacity = dest.size();
    po->op.arm();
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO |
                     UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // 1.13 leaves tag_info unset on immediate completion
    p.cb.recv = recv_cb;
    p.user_data = &po->op;
    p.recv_info.tag_info = &po->op.info;
    if (!po->op.track(ucp_tag_recv_nbx(e.worker, dest.data(), dest.size(), make_tag(cs_->rx_id, kBodyKind, seq),
                                       ~uint64_t(0), &p))) {
      const ucs_status_t st = po->op.status;
      KVS_LOG_ERROR("ucx: posting a receive from {} failed: {}", cs_->peer, ucs_status_string(st));
      return make_status(StatusCode::unavailable, "ucx: posting a receive from {} failed: {}", cs_->peer,
                         ucs_status_string(st));
    }
    cs_->posted.emplace(seq, std::move(po));
    return {};
  }

  Status recv_body(std::span<std::byte> dest, Deadline deadline, const CancelToken& cancel) override {
    Engine& e = *eng_;
    e.touch();
    std::unique_lock lk(e.mu);
    if (!cs_->body_pending) {
      if (dest.empty()) return {};
      return make_status(StatusCode::invalid_argument, "ucx: recv_body without a body announced by recv_header");
    }
    const size_t size = cs_->body_size;
    const uint32_t seq = cs_->body_seq;
    if (!dest.empty() && dest.size() < size)
      return make_status(StatusCode::invalid_argument, "ucx: body of {} bytes does not fit {} bytes", size,
                         dest.size());
    auto finish = [&] {
      cs_->body_pending = false;
      cs_->body_claimed = false;
      cs_->body_inline = false;
      cs_->consumed = seq + 1;
    };
    if (cs_->body_inline) {
      if (!dest.empty() && dest.data() != cs_->body_posted_dest)
        std::memcpy(dest.data(), (*cs_->ring)[seq % kHeaderRing].buf.data() + cs_->body_inline_off, size);
      cs_->body_posted_dest = nullptr;
      finish();
      return {};
    }
    if (auto it = cs_->posted.find(seq); it != cs_->posted.end()) {
      ConnState::Posted* po = it->second.get();
      // A body larger than the post completes it with UCS_ERR_MESSAGE_TRUNCATED.
      lk.unlock();
      Status s = e.wait(
          [&]() -> std::optional<Status> {
            if (po->op.done) return Status{};
            if (cs_->failed) return cs_->failure();
            return std::nullopt;
          },
          deadline, &cancel, "recv_body from", cs_->peer);
      if (!s.ok()) return s;  // the posted receive goes on; a retry picks it up
      lk.lock();
      po->op.release();
      Status result;
      if (po->op.status != UCS_OK)
        result = make_status(StatusCode::unavailable, "ucx: body from {} failed: {}", cs_->peer,
                             ucs_status_string(po->op.status));
      else if (po->op.length != size)
        result = make_status(StatusCode::corrupt_data, "ucx: body from {} has {} bytes, header said {}", cs_->peer,
                             po->op.length, size);
      else if (!dest.empty() && dest.data() != po->dest)
        std::memcpy(dest.data(), po->dest, size);
      cs_->posted.erase(it);
      finish();
      return result;
    }
    if (auto it = cs_->staged.find(seq); it != cs_->staged.end()) {
      ConnState::Staged* st = it->second.get();
      lk.unlock();
      Status s = e.wait(
          [&]() -> std::optional<Status> {
            if (st->op.done) return Status{};
            if (cs_->failed) return cs_->failure();
            return std::nullopt;
          },
          deadline, &cancel, "recv_body from", cs_->peer);
      if (!s.ok()) return s;  // the staged receive goes on; a retry picks it up
      lk.lock();
      st->op.release();
      Status result;
      if (st->op.status != UCS_OK)
        result = make_status(StatusCode::unavailable, "ucx: body from {} failed: {}", cs_->peer,
                             ucs_status_string(st->op.status));
      else if (st->op.length != size)
        result = make_status(StatusCode::corrupt_data, "ucx: body from {} has {} bytes, header said {}", cs_->peer,
                             st->op.length, size);
      else if (!dest.empty())
        std::memcpy(dest.data(), st->buf.get(), size);
      e.staged_bytes -= st->size;
      cs_->staged.erase(it);
      finish();
      return result;
    }
    if (cs_->failed) return cs_->failure();
    std::unique_ptr<std::byte[]> scratch;
    std::byte* target = dest.data();
    if (dest.empty()) {
      scratch.reset(new std::byte[size]);
      target = scratch.get();
    }
    Op op;
    op.arm();
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO |
                     UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // 1.13 leaves tag_info unset on immediate completion
    p.cb.recv = recv_cb;
    p.user_data = &op;
    p.recv_info.tag_info = &op.info;
    op.track(ucp_tag_recv_nbx(e.worker, target, size, make_tag(cs_->rx_id, kBodyKind, seq), ~uint64_t(0), &p));
    cs_->body_claimed = true;
    lk.unlock();
    Status s = e.wait(
        [&]() -> std::optional<Status> {
          if (op.done) return Status{};
          if (cs_->failed) return cs_->failure();
          return std::nullopt;
        },
        deadline, &cancel, "recv_body from", cs_->peer);
    if (!s.ok()) {
      {
        std::lock_guard g(e.mu);
        if (!op.done && op.req) ucp_request_cancel(e.worker, op.req);
      }
      if (!e.wait_quiet([&] { return op.done; }, 5s))
        KVS_LOG_ERROR("ucx: a body receive from {} did not complete after cancel", cs_->peer);
    }
    lk.lock();
    op.release();
    if (!op.done) {
      // Cannot happen with UCX's cancel semantics; never let the buffer be written later.
      std::abort();
    }
    if (op.status == UCS_OK && op.length == size) {
      finish();
      return {};
    }
    cs_->body_claimed = false;  // the body is still pending: a retry may receive it
    if (!s.ok()) return s;
    if (op.status == UCS_OK)
      return make_status(StatusCode::corrupt_data, "ucx: body from {} has {} bytes, header said {}", cs_->peer,
                         op.length, size);
    if (cs_->failed) return cs_->failure();
    return make_status(StatusCode::unavailable, "ucx: body from {} failed: {}", cs_->peer, ucs_status_string(op.status));
  }

  Status read(std::span<std::byte> dest, const RemoteRegion& src, uint64_t offset, Deadline deadline,
              const CancelToken& cancel) override {
    if (offset > src.size || dest.size() > src.size - offset)
      return make_status(StatusCode::out_of_range, "ucx: read of {} bytes at {} of a {}-byte remote region",
                         dest.size(), offset, src.size);
    if (dest.empty()) return {};
    if (src.key.empty()) return make_status(StatusCode::invalid_argument, "ucx: read without a remote key");
    Engine& e = *eng_;
    Op op;
    {
      std::lock_guard lk(e.mu);
      if (cs_->failed || !cs_->ep) return cs_->failure();
      ucp_rkey_h rkey = nullptr;
      std::string key(reinterpret_cast<const char*>(src.key.data()), src.key.size());
      if (auto it = cs_->rkeys.find(key); it != cs_->rkeys.end()) {
        rkey = it->second;
      } else {
        const ucs_status_t st = ucp_ep_rkey_unpack(cs_->ep, src.key.data(), &rkey);
        if (st != UCS_OK)
          return make_status(StatusCode::invalid_argument, "ucx: a remote key from {} does not unpack: {}", cs_->peer,
                             ucs_status_string(st));
        if (cs_->rkeys.size() >= 256) destroy_rkeys_locked(*cs_);  // bounded: a reader of many regions
        cs_->rkeys.emplace(std::move(key), rkey);
      }
      op.arm();
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = send_cb;
      p.user_data = &op;
      if (!op.track(ucp_get_nbx(cs_->ep, dest.data(), dest.size(), src.address + offset, rkey, &p)))
        return make_status(StatusCode::unavailable, "ucx: get from {} failed: {}", cs_->peer,
                           ucs_status_string(op.status));
    }
    Status s = e.wait(
        [&]() -> std::optional<Status> {
          if (op.done) return Status{};
          if (cs_->failed) return cs_->failure();
          return std::nullopt;
        },
        deadline, &cancel, "read from", cs_->peer);
    if (!op.done) {
      // An RMA get cannot be cancelled: close the endpoint so that it completes (with
      // an error) before we return; the connection is broken from here on.
      {
        std::lock_guard lk(e.mu);
        if (!cs_->failed) {
          cs_->failed = true;
          cs_->fail_msg = fmt::format("connection to {} unusable after an interrupted read ({})", cs_->peer,
                                      s.ok() ? std::string("peer failed") : s.message());
        }
        if (cs_->ep && !op.done) force_close_locked();
      }
      if (!e.wait_quiet([&] { return op.done; }, 5s)) {
        KVS_LOG_ERROR("ucx: a read from {} did not complete after the endpoint closed", cs_->peer);
        std::abort();  // never let it write the caller's buffer later
      }
    }
    std::lock_guard lk(e.mu);
    op.release();
    if (!s.ok()) return s;
    if (op.status != UCS_OK)
      return make_status(StatusCode::unavailable, "ucx: read from {} failed: {}", cs_->peer,
                         ucs_status_string(op.status));
    return {};
  }

  [[nodiscard]] std::string peer_address() const override { return cs_->peer; }
  [[nodiscard]] std::string describe() const override { return fmt::format("ucx {} ({})", cs_->peer, cs_->tls); }

 private:
  std::shared_ptr<Engine> eng_;
  std::shared_ptr<ConnState> cs_;
};

/// Creates the endpoint (from a sockaddr or a connection request), posts the header
/// receives, sends the hello and waits for the peer's.
Result<std::unique_ptr<Connection>> establish(const std::shared_ptr<Engine>& eng, ucp_ep_params_t params,
                                              std::string peer, Deadline deadline, const CancelToken* cancel) {
  Engine& e = *eng;
  auto cs = std::make_shared<ConnState>();
  cs->eng = &e;
  cs->peer = std::move(peer);
  {
    std::lock_guard lk(e.mu);
    cs->rx_id = e.alloc_rx_id();
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = e.peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    params.err_handler.cb = ep_error_cb;
    params.err_handler.arg = cs.get();
    ucs_status_t st = ucp_ep_create(e.worker, &params, &cs->ep);
    if (st != UCS_OK)
      return make_status(StatusCode::unavailable, "ucx: cannot create an endpoint to {}: {}", cs->peer,
                         ucs_status_string(st));
    e.by_ep[cs->ep] = cs.get();
    e.conns.insert(cs.get());
    e.repost_headers(*cs);
    cs->hello_out[1] = cs->rx_id;
    // Inline bodies are copied with memcpy: only where no side can hold cuda bodies.
    cs->hello_out[2] = e.cuda ? 0 : kHelloInlineOk;
    cs->hello_op.arm();
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = send_cb;
    p.user_data = &cs->hello_op;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    cs->hello_op.track(ucp_am_send_nbx(cs->ep, kHelloAmId, nullptr, 0, cs->hello_out, sizeof cs->hello_out, &p));
  }
  Status s = e.wait(
      [&]() -> std::optional<Status> {
        if (cs->failed) return cs->failure();
        if (cs->hello_op.done && cs->hello_op.status != UCS_OK)
          return make_status(StatusCode::unavailable, "ucx: handshake with {} failed: {}", cs->peer,
                             ucs_status_string(cs->hello_op.status));
        if (cs->hello && cs->hello_op.done) return Status{};
        return std::nullopt;
      },
      deadline, cancel, "connection setup with", cs->peer);
  if (!s.ok()) {
    {
      std::lock_guard lk(e.mu);
      if (!cs->failed) {
        cs->failed = true;  // force close: the peer may be absent
        cs->fail_msg = s.message();
      }
    }
    UcxConnection::close_conn(e, cs);
    return s;
  }
  {
    std::lock_guard lk(e.mu);
    cs->hello_op.release();
    cs->tls = ep_transports(cs->ep);
  }
  KVS_LOG_INFO("ucx: connected to {} over {} ({})", cs->peer, cs->tls, e.provider);
  return std::unique_ptr<Connection>(std::make_unique<UcxConnection>(eng, std::move(cs)));
}

Status resolve(const std::string& address, sockaddr_storage& out, socklen_t& len, bool passive) {
  KVS_ASSIGN_OR_RETURN(auto addrs, resolve_address("ucx", address, passive));
  out = addrs.front();
  len = sockaddr_len(out);
  return {};
}

class UcxListener final : public Listener {
 public:
  UcxListener(std::shared_ptr<Engine> eng, std::unique_ptr<ListenState> ls, std::string addr)
      : eng_(std::move(eng)), ls_(std::move(ls)), addr_(std::move(addr)) {}

  ~UcxListener() override {
    std::lock_guard lk(eng_->mu);
    for (auto* r : ls_->pending) ucp_listener_reject(ls_->h, r);
    ls_->pending.clear();
    ucp_listener_destroy(ls_->h);
  }

  Result<std::unique_ptr<Connection>> accept(Deadline deadline, const CancelToken& cancel) override {
    Engine& e = *eng_;
    Status s = e.wait(
        [&]() -> std::optional<Status> {
          if (!ls_->pending.empty()) return Status{};
          return std::nullopt;
        },
        deadline, &cancel, "accept on", addr_);
    if (!s.ok()) return s;
    ucp_conn_request_h req;
    std::string peer = "?";
    {
      std::lock_guard lk(e.mu);
      req = ls_->pending.front();
      ls_->pending.pop_front();
      ucp_conn_request_attr_t attr{};
      attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
      if (ucp_conn_request_query(req, &attr) == UCS_OK) peer = sockaddr_to_string(attr.client_address);
    }
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    params.conn_request = req;
    return establish(eng_, params, peer, deadline, &cancel);
  }

  [[nodiscard]] std::string address() const override { return addr_; }

 private:
  std::shared_ptr<Engine> eng_;
  std::unique_ptr<ListenState> ls_;
  std::string addr_;
};

class UcxBackend final : public Backend {
 public:
  explicit UcxBackend(std::shared_ptr<Engine> eng) : eng_(std::move(eng)) {
    caps_.backend = "ucx";
    caps_.provider = eng_->provider;
    caps_.host_memory = true;
    caps_.cuda_memory = eng_->cuda;
    caps_.one_sided_read = true;  // rkey gets: MemoryRegion::expose + Connection::read
    caps_.notifications = false;
    caps_.max_message_bytes = uint64_t(1) << 40;
  }

  [[nodiscard]] const Capabilities& capabilities() const override { return caps_; }

  Result<std::unique_ptr<Listener>> listen(const std::string& address) override {
    sockaddr_storage ss{};
    socklen_t len = 0;
    KVS_RETURN_IF_ERROR(resolve(address, ss, len, true));
    auto ls = std::make_unique<ListenState>();
    Engine& e = *eng_;
    std::lock_guard lk(e.mu);
    ucp_listener_params_t p{};
    p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
    p.sockaddr.addrlen = len;
    p.conn_handler.cb = conn_cb;
    p.conn_handler.arg = ls.get();
    ucs_status_t st = ucp_listener_create(e.worker, &p, &ls->h);
    if (st != UCS_OK)
      return make_status(StatusCode::unavailable, "ucx: cannot listen on {}: {}", address, ucs_status_string(st));
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    std::string bound = address;
    if (ucp_listener_query(ls->h, &attr) == UCS_OK) {
      // Keep the host as given (a wildcard bind reports 0.0.0.0), take the real port.
      std::string host;
      uint16_t port = 0;
      (void)parse_host_port(address, host, port);
      const std::string real = sockaddr_to_string(attr.sockaddr);
      const std::string real_port = real.substr(real.rfind(':') + 1);
      bound = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + real_port;
    }
    KVS_LOG_INFO("ucx: listening on {} ({})", bound, e.provider);
    return std::unique_ptr<Listener>(std::make_unique<UcxListener>(eng_, std::move(ls), bound));
  }

  Result<std::unique_ptr<Connection>> connect(const std::string& address, Deadline deadline,
                                              const CancelToken& cancel) override {
    sockaddr_storage ss{};
    socklen_t len = 0;
    KVS_RETURN_IF_ERROR(resolve(address, ss, len, false));
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
    params.sockaddr.addrlen = len;
    return establish(eng_, params, address, deadline, &cancel);
  }

  Result<MemoryRegion> register_memory(void* data, size_t size, MemoryType type) override {
    if (data == nullptr || size == 0)
      return make_status(StatusCode::invalid_argument, "ucx: cannot register an empty or null range");
    if (type == MemoryType::cuda && !eng_->cuda)
      return make_status(StatusCode::unsupported, "ucx: this UCX has no cuda transport; cannot register cuda memory");
    if (auto hit = eng_->cache.find(data, size, type)) return RegionAccess::wrap(hit);
    ucp_mem_map_params_t p{};
    p.field_mask =
        UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    p.address = data;
    p.length = size;
    p.memory_type = type == MemoryType::cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    auto r = std::make_shared<UcxRegion>();
    r->ctx = eng_->ctx;
    ucs_status_t st;
    {
      std::lock_guard lk(eng_->mu);
      st = ucp_mem_map(eng_->ctx->h, &p, &r->memh);
    }
    if (st != UCS_OK) {
      r->memh = nullptr;
      return make_status(StatusCode::resource_exhausted, "ucx: ucp_mem_map of {} bytes: {}", size,
                         ucs_status_string(st));
    }
    r->data = static_cast<std::byte*>(data);
    r->size = size;
    r->type = type;
    eng_->cache.insert(r);
    return RegionAccess::wrap(r);
  }

 private:
  std::shared_ptr<Engine> eng_;
  Capabilities caps_;
};

}  // namespace
}  // namespace ucx_detail

Result<std::unique_ptr<Backend>> make_ucx_backend(const BackendConfig& config) {
  KVS_ASSIGN_OR_RETURN(auto eng, ucx_detail::Engine::create(config));
  return std::unique_ptr<Backend>(std::make_unique<ucx_detail::UcxBackend>(std::move(eng)));
}

}  // namespace kvstream::transport

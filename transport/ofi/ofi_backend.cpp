// libfabric backend over RDM endpoints: see ofi_backend.hpp for the design.
#include "transport/ofi/ofi_backend.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "core/log.hpp"

namespace kvstream::transport {
namespace ofi {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kFiVersion = FI_VERSION(1, 17);

// ---- Tags ------------------------------------------------------------------------
enum class MsgType : uint64_t { hello = 1, hello_ack = 2, header = 3, body = 4, bye = 5 };
constexpr int kTypeShift = 60, kConnShift = 40, kSeqShift = 16;
constexpr uint64_t kConnMask = (uint64_t(1) << 20) - 1, kSeqMask = (uint64_t(1) << 24) - 1, kSegMask = 0xffff;
constexpr uint64_t kLow60 = (uint64_t(1) << 60) - 1;

uint64_t make_tag(MsgType t, uint64_t conn, uint64_t seq = 0, uint64_t seg = 0) {
  return (uint64_t(t) << kTypeShift) | ((conn & kConnMask) << kConnShift) | ((seq & kSeqMask) << kSeqShift) |
         (seg & kSegMask);
}

// ---- Wire structs ------------------------------------------------------------------
constexpr uint32_t kHelloMagic = 0x6b764f48;   // "kvOH"
constexpr uint32_t kHeaderMagic = 0x6b764f4d;  // "kvOM"
constexpr size_t kMaxAddrBytes = 256;

struct Hello {
  uint32_t magic;
  uint32_t addr_len;
  uint64_t nonce;
  unsigned char addr[kMaxAddrBytes];
};
struct HelloAck {
  uint32_t magic;
  uint32_t conn_id;
};
struct HeaderPrefix {
  uint32_t magic;
  uint32_t header_len;
  uint64_t body_size;
};
constexpr size_t kHeaderBufBytes = sizeof(HeaderPrefix) + kMaxHeaderBytes;

std::string fi_err(int err) { return fmt::format("{} ({})", fi_strerror(err < 0 ? -err : err), err < 0 ? -err : err); }

/// Strips "fi_sockaddr_in://" and the like from fi_av_straddr's output.
std::string strip_scheme(std::string s) {
  const size_t p = s.find("://");
  return p == std::string::npos ? s : s.substr(p + 3);
}

// ---- Core: fabric, domain, registrations ---------------------------------------------
struct OfiRegion;

struct Core {
  fi_info* hints = nullptr;  // what every fi_getinfo asks for (provider fixed)
  fi_info* info = nullptr;   // the one the domain was opened with
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  std::string provider;
  bool mr_local = false, mr_prov_key = false, mr_virt_addr = false, rma = false, hmem = false;
  size_t segment = kMaxSegmentBytes;
  size_t inject = 0;
  std::atomic<uint64_t> next_key{1};

  std::mutex regions_mu;
  std::map<uintptr_t, OfiRegion*> regions;  // by start address, for descriptors

  ~Core() {
    if (domain) fi_close(&domain->fid);
    if (fabric) fi_close(&fabric->fid);
    if (info) fi_freeinfo(info);
    if (hints) fi_freeinfo(hints);
  }
  void* desc_for(const void* p, size_t n);
};

/// Wire form of a libfabric remote key (RemoteRegion::key): u64 key, then one byte
/// saying how the reader addresses the region (1: by virtual address, FI_MR_VIRT_ADDR;
/// 0: by offset from its start). The reader checks the byte against its own domain,
/// so two ends that disagree fail clearly instead of reading the wrong bytes.
constexpr size_t kRemoteKeyBytes = 9;

struct OfiRegion final : MemoryRegion::Impl {
  std::shared_ptr<Core> core;
  fid_mr* mr = nullptr;
  Result<std::vector<std::byte>> packed_key() const override {
    if (!core->rma)
      return make_status(StatusCode::unsupported, "libfabric: provider {} has no FI_RMA reads", core->provider);
    const uint64_t key = fi_mr_key(mr);
    if (key == FI_KEY_NOTAVAIL)
      return make_status(StatusCode::unsupported, "libfabric: provider {} gives no key for this region",
                         core->provider);
    std::vector<std::byte> out(kRemoteKeyBytes);
    std::memcpy(out.data(), &key, sizeof key);
    out[8] = std::byte{core->mr_virt_addr ? uint8_t(1) : uint8_t(0)};
    return out;
  }
  ~OfiRegion() override {
    {
      std::lock_guard lock(core->regions_mu);
      auto it = core->regions.find(reinterpret_cast<uintptr_t>(data));
      if (it != core->regions.end() && it->second == this) core->regions.erase(it);
    }
    if (mr) fi_close(&mr->fid);
  }
};

void* Core::desc_for(const void* p, size_t n) {
  std::lock_guard lock(regions_mu);
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = regions.upper_bound(a);
  if (it == regions.begin()) return nullptr;
  --it;
  OfiRegion* r = it->second;
  if (a + n > it->first + r->size || !r->mr) return nullptr;
  return fi_mr_desc(r->mr);
}

// ---- Operations and endpoints ---------------------------------------------------------

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
  std::function<void(Op&)> on_complete;  // runs in whichever thread reaps the completion
  ~Op() {
    if (mr) fi_close(&mr->fid);
  }
};

class Endpoint {
 public:
  static Result<std::shared_ptr<Endpoint>> open(std::shared_ptr<Core> core, fi_info* info) {
    auto e = std::shared_ptr<Endpoint>(new Endpoint(std::move(core)));
    KVS_RETURN_IF_ERROR(e->init(info));
    e->progress_ = std::thread([p = e.get()] { p->progress_loop(); });
    return e;
  }

  ~Endpoint() {
    stop_.store(true);
    wake();
    if (progress_.joinable()) progress_.join();
    if (ep_) fi_close(&ep_->fid);
    if (cq_) fi_close(&cq_->fid);
    if (av_) fi_close(&av_->fid);
    inflight_.clear();  // the endpoint is closed: nothing refers to these any more
  }

  Core& core() { return *core_; }

  /// The endpoint's own address (fi_getname).
  Result<std::vector<unsigned char>> name() {
    std::vector<unsigned char> a(kMaxAddrBytes);
    size_t len = a.size();
    int r = fi_getname(&ep_->fid, a.data(), &len);
    if (r) return make_status(StatusCode::internal, "libfabric: fi_getname: {}", fi_err(r));
    a.resize(len);
    return a;
  }

  Result<fi_addr_t> insert(const void* addr) {
    fi_addr_t fa = FI_ADDR_UNSPEC;
    int r = fi_av_insert(av_, addr, 1, &fa, 0, nullptr);
    if (r != 1) return make_status(StatusCode::unavailable, "libfabric: fi_av_insert failed: {}", fi_err(r));
    return fa;
  }

  std::string straddr(const void* addr) {
    char buf[256];
    size_t len = sizeof buf;
    fi_av_straddr(av_, addr, buf, &len);
    buf[sizeof buf - 1] = 0;
    return buf;
  }

  std::shared_ptr<Op> new_op(size_t buf_size = 0) {
    auto op = std::make_shared<Op>();
    if (buf_size) {
      op->buf = std::make_shared_for_overwrite<std::byte[]>(buf_size);
      op->buf_size = buf_size;
    }
    return op;
  }

  /// Registers op->buf when the provider needs local descriptors; returns the descriptor.
  Result<void*> local_desc(Op& op) {
    if (!core_->mr_local || !op.buf) return static_cast<void*>(nullptr);
    if (!op.mr) {
      int r = fi_mr_reg(core_->domain, op.buf.get(), op.buf_size, FI_SEND | FI_RECV, 0,
                        core_->next_key.fetch_add(1), 0, &op.mr, nullptr);
      if (r) return make_status(StatusCode::resource_exhausted, "libfabric: fi_mr_reg (internal): {}", fi_err(r));
    }
    return fi_mr_desc(op.mr);
  }

  /// Posts a tagged receive (retrying while the provider says EAGAIN).
  Status post_recv(const std::shared_ptr<Op>& op, void* buf, size_t len, void* desc, uint64_t tag, uint64_t ignore,
                   Deadline deadline) {
    if (!ep_) return closed_error();
    track(op);
    for (int idle = 0;;) {
      ssize_t r = fi_trecv(ep_, buf, len, desc, FI_ADDR_UNSPEC, tag, ignore, &op->ctx);
      if (r == 0) return {};
      if (r != -FI_EAGAIN || Clock::now() >= deadline) {
        untrack(op.get());
        return make_status(r == -FI_EAGAIN ? StatusCode::timed_out : StatusCode::io_error,
                           "libfabric: fi_trecv: {}", fi_err(int(r)));
      }
      if (poll() == 0) backoff(idle++);
    }
  }

  /// Posts a tagged send from op->buf (or `buf`) to `dest`.
  Status post_send(const std::shared_ptr<Op>& op, const void* buf, size_t len, void* desc, fi_addr_t dest,
                   uint64_t tag, Deadline deadline, const CancelToken& cancel) {
    if (!ep_) return closed_error();
    track(op);
    if (op->counted) {
      active_sends_.fetch_add(1);
      wake();
    }
    Status s = retry_post([&] { return fi_tsend(ep_, buf, len, desc, dest, tag, &op->ctx); }, "fi_tsend", "send",
                          deadline, cancel);
    if (!s.ok() && untrack(op.get()) && op->counted) active_sends_.fetch_sub(1);
    return s;
  }

  /// fi_tinject: buffered by the provider, no completion.
  Status inject(const void* buf, size_t len, fi_addr_t dest, uint64_t tag, Deadline deadline,
                const CancelToken& cancel) {
    if (!ep_) return closed_error();
    return retry_post([&] { return fi_tinject(ep_, buf, len, dest, tag); }, "fi_tinject", "send", deadline, cancel);
  }

  /// Makes one post (`attempt`: an fi_* call) until the provider takes it, retrying
  /// while it says EAGAIN (polling the CQ frees queue entries) until the deadline or a
  /// cancel. `call` names the fi_* function, `what` the operation, in errors.
  template <typename Attempt>
  Status retry_post(Attempt attempt, std::string_view call, std::string_view what, Deadline deadline,
                    const CancelToken& cancel) {
    for (int idle = 0;;) {
      const ssize_t r = attempt();
      if (r == 0) return {};
      if (r != -FI_EAGAIN) return make_status(StatusCode::unavailable, "libfabric: {}: {}", call, fi_err(int(r)));
      if (cancel.cancelled()) return make_status(StatusCode::cancelled, "libfabric: {} cancelled", what);
      if (Clock::now() >= deadline)
        return make_status(StatusCode::timed_out, "libfabric: {} queue stayed full until the deadline", what);
      if (poll() == 0) backoff(idle++);
    }
  }

  /// Waits (polling the CQ) until pred() holds. ok, timed_out or cancelled.
  template <typename Pred>
  Status wait(Pred pred, Deadline deadline, const CancelToken* cancel, std::string_view what) {
    for (int idle = 0;;) {
      const int n = poll();
      if (pred()) return {};
      if (cancel && cancel->cancelled()) return make_status(StatusCode::cancelled, "libfabric: {} cancelled", what);
      if (Clock::now() >= deadline) return make_status(StatusCode::timed_out, "libfabric: {} timed out", what);
      if (n > 0)
        idle = 0;
      else
        backoff(idle++);
    }
  }

  /// Cancels a posted receive and waits for its completion (normal or FI_ECANCELED),
  /// so the provider no longer refers to its buffer. False if it never completed.
  bool cancel_and_drain(Op& op, std::chrono::milliseconds limit = 10s) {
    if (op.done.load(std::memory_order_acquire)) return true;
    if (!ep_) return false;  // closed: the provider dropped it (our buffer, never reused)
    fi_cancel(&ep_->fid, &op.ctx);
    auto st = wait([&] { return op.done.load(std::memory_order_acquire); }, deadline_in(limit), nullptr, "cancel");
    return st.ok();
  }

  /// One attempt at a tagged send (no retry): 0, -FI_EAGAIN (nothing posted) or
  /// another negative FI_E* error. The op is tracked and keeps the progress thread
  /// busy until its completion.
  ssize_t try_send(const std::shared_ptr<Op>& op, const void* buf, size_t len, void* desc, fi_addr_t dest,
                   uint64_t tag) {
    if (!ep_) return -FI_ESHUTDOWN;
    track(op);
    op->counted = true;
    active_sends_.fetch_add(1);
    const ssize_t r = fi_tsend(ep_, buf, len, desc, dest, tag, &op->ctx);
    if (r == 0) {
      wake();
      return 0;
    }
    if (untrack(op.get())) active_sends_.fetch_sub(1);
    op->counted = false;
    return r;
  }

  /// One attempt at fi_tinject (no retry, no completion).
  ssize_t try_inject(const void* buf, size_t len, fi_addr_t dest, uint64_t tag) {
    if (!ep_) return -FI_ESHUTDOWN;
    return fi_tinject(ep_, buf, len, dest, tag);
  }

  /// Posts an RMA read of `len` bytes at the peer's `addr` under `key` into `buf`
  /// (retrying while the provider says EAGAIN, until the deadline or cancel).
  Status post_read(const std::shared_ptr<Op>& op, void* buf, size_t len, void* desc, fi_addr_t src, uint64_t addr,
                   uint64_t key, Deadline deadline, const CancelToken& cancel) {
    if (!ep_) return closed_error();
    track(op);
    Status s = retry_post([&] { return fi_read(ep_, buf, len, desc, src, addr, key, &op->ctx); }, "fi_read", "read",
                          deadline, cancel);
    if (!s.ok()) untrack(op.get());
    return s;
  }

  /// Closes the endpoint now, with operations still posted: the provider drops them,
  /// so none of them touches its buffer afterwards (what an interrupted RMA read,
  /// which libfabric cannot cancel, needs). Only for an endpoint one connection owns.
  /// Every later post fails with unavailable.
  void close_now() {
    if (!ep_) return;
    stop_.store(true);
    wake();
    if (progress_.joinable()) progress_.join();
    fi_close(&ep_->fid);
    ep_ = nullptr;
  }

  /// Asks the provider to cancel a posted operation (it may not support it for sends).
  void cancel(Op& op) {
    if (ep_ && !op.done.load(std::memory_order_acquire)) fi_cancel(&ep_->fid, &op.ctx);
  }

  /// One pass over the CQ; routes completions. Returns how many it handled.
  int poll() {
    fi_cq_tagged_entry e[16];
    ssize_t n;
    fi_cq_err_entry err{};
    int got_err = 0;
    {
      std::lock_guard plock(poll_mu_);
      n = fi_cq_read(cq_, e, 16);
      if (n == -FI_EAVAIL) got_err = int(fi_cq_readerr(cq_, &err, 0));
    }
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) complete(e[i].op_context, 0, e[i].len, e[i].tag);
      return int(n);
    }
    if (n == -FI_EAVAIL) {
      if (got_err == 1) {
        if (err.err != FI_ECANCELED)
          KVS_LOG_DEBUG("libfabric: completion error {}", fi_err(err.err));
        complete(err.op_context, err.err ? err.err : FI_EIO, err.len, err.tag);
        return 1;
      }
    }
    return 0;
  }

  static void backoff(int idle) {
    if (idle < 64)
      std::this_thread::yield();
    else if (idle < 2000)
      std::this_thread::sleep_for(20us);
    else
      std::this_thread::sleep_for(200us);
  }

 private:
  explicit Endpoint(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  static Status closed_error() {
    return make_status(StatusCode::unavailable, "libfabric: the endpoint was closed after an interrupted read");
  }

  Status init(fi_info* info) {
    int r = fi_endpoint(core_->domain, info, &ep_, nullptr);
    if (r) return make_status(StatusCode::unavailable, "libfabric: fi_endpoint: {}", fi_err(r));
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    if ((r = fi_av_open(core_->domain, &av_attr, &av_, nullptr)))
      return make_status(StatusCode::unavailable, "libfabric: fi_av_open: {}", fi_err(r));
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.wait_obj = FI_WAIT_NONE;
    cq_attr.size = 0;
    if ((r = fi_cq_open(core_->domain, &cq_attr, &cq_, nullptr)))
      return make_status(StatusCode::unavailable, "libfabric: fi_cq_open: {}", fi_err(r));
    if ((r = fi_ep_bind(ep_, &av_->fid, 0)))
      return make_status(StatusCode::unavailable, "libfabric: fi_ep_bind(av): {}", fi_err(r));
    if ((r = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV)))
      return make_status(StatusCode::unavailable, "libfabric: fi_ep_bind(cq): {}", fi_err(r));
    if ((r = fi_enable(ep_))) return make_status(StatusCode::unavailable, "libfabric: fi_enable: {}", fi_err(r));
    return {};
  }

  void track(const std::shared_ptr<Op>& op) {
    std::lock_guard lock(mu_);
    inflight_[op.get()] = op;
  }
  bool untrack(Op* op) {
    std::lock_guard lock(mu_);
    return inflight_.erase(op) > 0;
  }

  void complete(void* context, int err, size_t len, uint64_t tag) {
    if (!context) return;  // e.g. an error for an inject, which has no operation
    std::shared_ptr<Op> op;
    {
      std::lock_guard lock(mu_);
      auto it = inflight_.find(static_cast<Op*>(context));
      if (it == inflight_.end()) return;
      op = std::move(it->second);
      inflight_.erase(it);
    }
    op->err = err;
    op->len = len;
    op->tag = tag;
    if (op->counted) active_sends_.fetch_sub(1);
    op->done.store(true, std::memory_order_release);
    if (op->on_complete) op->on_complete(*op);
  }

  void wake() {
    std::lock_guard lock(wake_mu_);
    kick_ = true;
    wake_cv_.notify_one();
  }

  void progress_loop() {
    int idle = 0;
    while (!stop_.load()) {
      if (poll() > 0) {
        idle = 0;
        continue;
      }
      if (active_sends_.load() > 0) {
        backoff(idle++);
        continue;
      }
      std::unique_lock lock(wake_mu_);
      wake_cv_.wait_for(lock, 1ms, [&] { return kick_ || stop_.load(); });
      kick_ = false;
      idle = 0;
    }
  }

  std::shared_ptr<Core> core_;
  fid_ep* ep_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  std::mutex mu_;
  std::mutex poll_mu_;
  std::unordered_map<Op*, std::shared_ptr<Op>> inflight_;
  std::atomic<int> active_sends_{0};
  std::atomic<bool> stop_{false};
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  bool kick_ = false;
  std::thread progress_;
};

// ---- Connection -------------------------------------------------------------------------

/// State the completion callbacks touch (outlives the Connection if need be).
struct ConnShared {
  std::atomic<bool> bye{false};
  std::atomic<uint64_t> peer_sent{0};  // messages the peer says it sent (valid once bye)
  std::atomic<int> send_error{0};      // first async send error (FI_E*)
};

class OfiConnection final : public Connection {
 public:
  /// `owns_endpoint`: the endpoint is this connection's alone (a client's), so an
  /// interrupted read may close it; an accepted connection shares its listener's.
  OfiConnection(std::shared_ptr<Endpoint> ep, fi_addr_t peer, uint32_t id, std::string peer_name,
                bool owns_endpoint)
      : ep_(std::move(ep)), peer_(peer), id_(id), peer_name_(std::move(peer_name)), owns_endpoint_(owns_endpoint),
        shared_(std::make_shared<ConnShared>()) {}

  /// Posts the receive for the peer's "bye".
  Status start() {
    bye_op_ = ep_->new_op(sizeof(uint64_t));
    auto sh = shared_;
    bye_op_->on_complete = [sh](Op& op) {
      if (op.err) return;
      uint64_t n = 0;
      std::memcpy(&n, op.buf.get(), sizeof n);
      sh->peer_sent.store(n);
      sh->bye.store(true, std::memory_order_release);
    };
    KVS_ASSIGN_OR_RETURN(void* desc, ep_->local_desc(*bye_op_));
    return ep_->post_recv(bye_op_, bye_op_->buf.get(), sizeof(uint64_t), desc, make_tag(MsgType::bye, id_), 0,
                          deadline_in(5s));
  }

  ~OfiConnection() override {
    // Let our sends finish (bounded), then say bye so the peer stops waiting at once.
    // Sends still outstanding then are cancelled: their bodies are the caller's.
    (void)ep_->wait(
        [&] {
          (void)flush();
          reap();
          return outstanding_.empty() || shared_->send_error.load() != 0;
        },
        deadline_in(2s), nullptr, "close");
    if (!outstanding_.empty()) abort_sends();
    // A peer that said bye is gone: sending to it is pointless, and with shm in one
    // process its memory may already be unmapped. Give its bye a moment to be reaped.
    (void)ep_->wait([&] { return shared_->bye.load(); }, deadline_in(3ms), nullptr, "close");
    // After our own abort (FI_ECANCELED) the peer is alive: it still gets the bye, so
    // it neither waits for more nor sends to an endpoint that is going away.
    if (const int e = shared_->send_error.load(); (e == 0 || e == FI_ECANCELED) && !shared_->bye.load()) {
      auto op = ep_->new_op(sizeof(uint64_t));
      const uint64_t n = send_seq_;
      std::memcpy(op->buf.get(), &n, sizeof n);
      auto desc = ep_->local_desc(*op);
      if (desc.ok() && ep_->post_send(op, op->buf.get(), sizeof n, *desc, peer_, make_tag(MsgType::bye, id_),
                                      deadline_in(500ms), CancelToken{})
                           .ok())
        (void)ep_->wait([&] { return op->done.load(); }, deadline_in(500ms), nullptr, "bye");
    }
    if (bye_op_) ep_->cancel_and_drain(*bye_op_, 1s);
    if (hdr_op_) ep_->cancel_and_drain(*hdr_op_, 1s);
    for (auto& op : body_ops_) ep_->cancel_and_drain(*op, 1s);
  }

  Result<uint64_t> post_send(std::span<const std::byte> header, std::span<const std::byte> body) override {
    if (header.size() > kMaxHeaderBytes)
      return make_status(StatusCode::invalid_argument, "libfabric: header of {} bytes exceeds {}", header.size(),
                         kMaxHeaderBytes);
    KVS_RETURN_IF_ERROR(send_usable());
    Core& core = ep_->core();
    const size_t seg = core.segment;
    const bool body_inject = !body.empty() && body.size() <= core.inject && body.size() <= seg;
    void* bdesc = nullptr;
    if (!body.empty() && !body_inject) {
      bdesc = core.desc_for(body.data(), body.size());
      if (!bdesc && core.mr_local)
        return make_status(StatusCode::invalid_argument,
                           "libfabric: body buffer is not registered with this backend (provider needs FI_MR_LOCAL)");
    }
    const uint64_t seq = send_seq_;  // on the wire; the caller sees seq + 1
    Msg msg{seq + 1, {}};
    std::vector<Piece> pieces;

    // Header message: copied (prefix + header), injected when small enough.
    const size_t hlen = sizeof(HeaderPrefix) + header.size();
    HeaderPrefix prefix{kHeaderMagic, uint32_t(header.size()), uint64_t(body.size())};
    auto hop = new_send_op(hlen);
    std::memcpy(hop->buf.get(), &prefix, sizeof prefix);
    if (!header.empty()) std::memcpy(hop->buf.get() + sizeof prefix, header.data(), header.size());
    const bool hinject = hlen <= core.inject;
    void* hdesc = nullptr;
    if (!hinject) {
      KVS_ASSIGN_OR_RETURN(hdesc, ep_->local_desc(*hop));
    }
    pieces.push_back({hop, hop->buf.get(), hlen, hdesc, make_tag(MsgType::header, id_, seq), hinject});

    // Body: straight from the caller's registered memory, as segments (zero copy);
    // a tiny body is injected (the provider copies it at once).
    if (body_inject) {
      pieces.push_back({new_send_op(0), body.data(), body.size(), nullptr, make_tag(MsgType::body, id_, seq, 0), true});
    } else if (!body.empty()) {
      const size_t nseg = (body.size() + seg - 1) / seg;
      for (size_t i = 0; i < nseg; ++i) {
        const size_t off = i * seg, n = std::min(seg, body.size() - off);
        pieces.push_back(
            {new_send_op(0), body.data() + off, n, bdesc, make_tag(MsgType::body, id_, seq, i), false});
      }
    }
    for (auto& p : pieces) {
      msg.ops.push_back(p.op);
      backlog_.push_back(std::move(p));
    }
    outstanding_.push_back(std::move(msg));
    ++send_seq_;  // the message is committed: it goes out whole, or the connection breaks
    if (Status st = flush(); !st.ok()) {
      abort_sends();
      return st;
    }
    return seq + 1;
  }

  Status wait_sends(uint64_t seq, Deadline deadline, const CancelToken& cancel) override {
    if (seq > send_seq_)
      return make_status(StatusCode::invalid_argument, "libfabric: wait_sends({}) but only {} messages posted", seq,
                         send_seq_);
    auto failed = [&]() -> Status {
      abort_sends();
      return make_status(StatusCode::unavailable, "libfabric: send to {} failed: {}", peer_name_,
                         fi_err(shared_->send_error.load()));
    };
    if (shared_->send_error.load()) return failed();
    Status flushed;
    auto st = ep_->wait(
        [&] {
          if (flushed.ok()) flushed = flush();
          reap();
          return !flushed.ok() || shared_->send_error.load() != 0 || outstanding_.empty() ||
                 outstanding_.front().seq > seq;
        },
        deadline, &cancel, "wait_sends");
    if (!st.ok()) {
      // Nothing may read the caller's bodies after we return: the connection breaks.
      abort_sends();
      return st;
    }
    if (!flushed.ok()) {
      abort_sends();
      return flushed;
    }
    if (shared_->send_error.load()) return failed();
    return {};
  }

  Result<size_t> recv_header(std::vector<std::byte>& header, Deadline deadline, const CancelToken& cancel) override {
    if (!broken_.empty()) return make_status(StatusCode::unavailable, "libfabric: {}", broken_);
    if (body_pending_)
      return make_status(StatusCode::invalid_argument,
                         "libfabric: the previous message's body ({} bytes) must be read with recv_body first",
                         body_size_);
    if (!hdr_op_) {
      // Kept posted across a timeout or cancel: the buffer is ours, so nothing lands in
      // the caller's memory later, and no message is lost.
      hdr_op_ = ep_->new_op(kHeaderBufBytes);
      KVS_ASSIGN_OR_RETURN(void* desc, ep_->local_desc(*hdr_op_));
      auto st = ep_->post_recv(hdr_op_, hdr_op_->buf.get(), kHeaderBufBytes, desc,
                               make_tag(MsgType::header, id_, recv_seq_), 0, deadline);
      if (!st.ok()) {
        hdr_op_.reset();
        return st;
      }
    }
    bool closed = false;
    auto st = ep_->wait(
        [&] {
          if (hdr_op_->done.load(std::memory_order_acquire)) return true;
          if (shared_->bye.load(std::memory_order_acquire) && shared_->peer_sent.load() <= recv_seq_) closed = true;
          return closed;
        },
        deadline, &cancel, "recv_header");
    if (!st.ok()) return st;
    if (!hdr_op_->done.load(std::memory_order_acquire))
      return make_status(StatusCode::unavailable, "libfabric: peer {} closed the connection", peer_name_);
    auto op = std::move(hdr_op_);
    if (op->err)
      return make_status(StatusCode::unavailable, "libfabric: receive from {} failed: {}", peer_name_,
                         fi_err(op->err));
    HeaderPrefix prefix;
    if (op->len < sizeof prefix) return corrupt("short header message");
    std::memcpy(&prefix, op->buf.get(), sizeof prefix);
    if (prefix.magic != kHeaderMagic || prefix.header_len > kMaxHeaderBytes ||
        op->len != sizeof prefix + prefix.header_len)
      return corrupt("malformed header message");
    header.assign(op->buf.get() + sizeof prefix, op->buf.get() + op->len);
    ++recv_seq_;
    body_size_ = prefix.body_size;
    body_pending_ = body_size_ > 0;
    return size_t(prefix.body_size);
  }

  Status recv_body(std::span<std::byte> dest, Deadline deadline, const CancelToken& cancel) override {
    if (!broken_.empty()) return make_status(StatusCode::unavailable, "libfabric: {}", broken_);
    if (!body_pending_) {
      if (dest.empty() || body_size_ == 0) return {};
      return make_status(StatusCode::invalid_argument, "libfabric: no body announced (call recv_header first)");
    }
    const size_t n = body_size_;
    if (!dest.empty() && dest.size() < n)
      return make_status(StatusCode::invalid_argument, "libfabric: body of {} bytes does not fit {} bytes", n,
                         dest.size());
    Core& core = ep_->core();
    const uint64_t seq = recv_seq_ - 1;
    const size_t seg = core.segment, nseg = (n + seg - 1) / seg;
    std::shared_ptr<std::byte[]> scratch;
    std::byte* base = dest.data();
    void* desc = nullptr;
    std::shared_ptr<Op> scratch_holder;
    if (dest.empty()) {  // discard: into a scratch buffer
      scratch_holder = ep_->new_op(n);
      base = scratch_holder->buf.get();
      auto d = ep_->local_desc(*scratch_holder);
      if (!d.ok()) return d.status();
      desc = *d;
    } else {
      desc = core.desc_for(base, n);
      if (!desc && core.mr_local)
        return make_status(StatusCode::invalid_argument,
                           "libfabric: body buffer is not registered with this backend (provider needs FI_MR_LOCAL)");
    }
    body_ops_.clear();
    for (size_t i = 0; i < nseg; ++i) {
      const size_t off = i * seg, len = std::min(seg, n - off);
      auto op = ep_->new_op();
      if (scratch_holder) op->buf = scratch_holder->buf;
      auto st = ep_->post_recv(op, base + off, len, desc, make_tag(MsgType::body, id_, seq, i), 0, deadline);
      if (!st.ok()) {
        for (auto& o : body_ops_) ep_->cancel_and_drain(*o);
        return fail_body(st);
      }
      body_ops_.push_back(std::move(op));
    }
    auto all_done = [&] {
      for (auto& o : body_ops_)
        if (!o->done.load(std::memory_order_acquire)) return false;
      return true;
    };
    auto st = ep_->wait(all_done, deadline, &cancel, "recv_body");
    if (!st.ok()) {
      // Nothing may write into the caller's buffer after we return.
      for (auto& o : body_ops_)
        if (!ep_->cancel_and_drain(*o, 30s)) {
          broken_ = "a body receive could not be cancelled";
          KVS_LOG_ERROR("libfabric: a receive into a caller's buffer could not be cancelled");
        }
      return fail_body(st);
    }
    for (auto& o : body_ops_)
      if (o->err) {
        auto e = make_status(StatusCode::unavailable, "libfabric: body from {} failed: {}", peer_name_,
                             fi_err(o->err));
        body_ops_.clear();
        broken_ = e.message();
        return e;
      }
    body_ops_.clear();
    body_pending_ = false;
    return {};
  }

  Status read(std::span<std::byte> dest, const RemoteRegion& src, uint64_t offset, Deadline deadline,
              const CancelToken& cancel) override {
    Core& core = ep_->core();
    if (!core.rma)
      return make_status(StatusCode::unsupported, "libfabric: provider {} has no FI_RMA reads", core.provider);
    if (offset > src.size || dest.size() > src.size - offset)
      return make_status(StatusCode::out_of_range, "libfabric: read of {} bytes at {} of a {}-byte remote region",
                         dest.size(), offset, src.size);
    if (dest.empty()) return {};
    if (cancel.cancelled()) return make_status(StatusCode::cancelled, "libfabric: read cancelled");
    if (src.key.size() != kRemoteKeyBytes || uint8_t(src.key[8]) > 1)
      return make_status(StatusCode::invalid_argument, "libfabric: a remote key from {} is malformed ({} bytes)",
                         peer_name_, src.key.size());
    if ((uint8_t(src.key[8]) == 1) != core.mr_virt_addr)
      return make_status(StatusCode::invalid_argument,
                         "libfabric: a remote key from {} addresses its region {}, this domain {}", peer_name_,
                         uint8_t(src.key[8]) ? "by virtual address" : "by offset",
                         core.mr_virt_addr ? "by virtual address" : "by offset");
    if (!broken_.empty()) return make_status(StatusCode::unavailable, "libfabric: {}", broken_);
    if (shared_->bye.load())
      return make_status(StatusCode::unavailable, "libfabric: peer {} closed the connection", peer_name_);
    uint64_t key = 0;
    std::memcpy(&key, src.key.data(), sizeof key);
    void* desc = core.desc_for(dest.data(), dest.size());
    if (!desc && core.mr_local)
      return make_status(StatusCode::invalid_argument,
                         "libfabric: read destination is not registered with this backend (provider needs FI_MR_LOCAL)");
    // With FI_MR_VIRT_ADDR the target address is the owner's virtual address, else the
    // offset into the registration.
    const uint64_t base = (core.mr_virt_addr ? src.address : 0) + offset;
    const size_t seg = core.segment, nseg = (dest.size() + seg - 1) / seg;
    std::vector<std::shared_ptr<Op>> ops;
    ops.reserve(nseg);
    auto all_done = [&] {
      for (auto& o : ops)
        if (!o->done.load(std::memory_order_acquire)) return false;
      return true;
    };
    Status st;
    for (size_t i = 0; i < nseg && st.ok(); ++i) {
      const size_t off = i * seg, len = std::min(seg, dest.size() - off);
      auto op = ep_->new_op();
      st = ep_->post_read(op, dest.data() + off, len, desc, peer_, base + off, key, deadline, cancel);
      if (st.ok()) ops.push_back(std::move(op));
    }
    if (st.ok())
      st = ep_->wait([&] { return all_done() || shared_->bye.load(std::memory_order_acquire); }, deadline, &cancel,
                     "read");
    if (st.ok() && !all_done())
      st = make_status(StatusCode::unavailable, "libfabric: peer {} closed the connection during a read", peer_name_);
    if (!st.ok()) {
      // RMA reads cannot be cancelled: nothing may land in `dest` after we return, so
      // wait briefly for them, then close the endpoint (ours alone) under them.
      if (!ep_->wait(all_done, deadline_in(20ms), nullptr, "read drain").ok()) {
        if (owns_endpoint_) {
          ep_->close_now();
        } else {
          KVS_LOG_ERROR("libfabric: a read into a caller's buffer from {} could not be stopped", peer_name_);
        }
      }
      broken_ = fmt::format("connection to {} unusable after an interrupted read ({})", peer_name_, st.message());
      return st;
    }
    for (auto& o : ops)
      if (o->err) {
        broken_ = fmt::format("read from {} failed: {}", peer_name_, fi_err(o->err));
        return make_status(StatusCode::unavailable, "libfabric: {}", broken_);
      }
    return {};
  }

  std::string describe() const override {
    return fmt::format("libfabric {} ({})", peer_name_, ep_->core().provider);
  }

 private:
  /// One piece of a posted message (header, or a body segment) not yet handed to the
  /// provider because its queue was full.
  struct Piece {
    std::shared_ptr<Op> op;
    const void* buf;
    size_t len;
    void* desc;
    uint64_t tag;
    bool inject;
  };
  /// A posted message and the operations it is made of.
  struct Msg {
    uint64_t seq;  // as returned by post_send
    std::vector<std::shared_ptr<Op>> ops;
  };

  Status send_usable() const {
    if (int e = shared_->send_error.load())
      return make_status(StatusCode::unavailable, "libfabric: connection to {} is broken: {}", peer_name_, fi_err(e));
    if (shared_->bye.load())
      return make_status(StatusCode::unavailable, "libfabric: peer {} closed the connection", peer_name_);
    return {};
  }

  std::shared_ptr<Op> new_send_op(size_t buf_size) {
    auto op = ep_->new_op(buf_size);
    auto sh = shared_;
    op->on_complete = [sh](Op& o) {
      if (o.err) {
        int expected = 0;
        sh->send_error.compare_exchange_strong(expected, o.err);
        if (o.err != FI_ECANCELED) KVS_LOG_WARN("libfabric: send failed: {}", fi_err(o.err));
      }
    };
    return op;
  }

  /// Hands queued pieces to the provider, in order, until it says its queue is full.
  Status flush() {
    while (!backlog_.empty()) {
      Piece& p = backlog_.front();
      const ssize_t r = p.inject ? ep_->try_inject(p.buf, p.len, peer_, p.tag)
                                 : ep_->try_send(p.op, p.buf, p.len, p.desc, peer_, p.tag);
      if (r == -FI_EAGAIN) {
        ep_->poll();  // completions free queue entries
        return {};
      }
      if (r != 0) {
        int expected = 0;
        shared_->send_error.compare_exchange_strong(expected, int(-r));
        return make_status(StatusCode::unavailable, "libfabric: send to {} failed: {}", peer_name_, fi_err(int(r)));
      }
      if (p.inject) p.op->done.store(true, std::memory_order_release);
      backlog_.pop_front();
    }
    return {};
  }

  /// Drops the messages at the front whose operations all completed.
  void reap() {
    while (!outstanding_.empty()) {
      for (auto& op : outstanding_.front().ops)
        if (!op->done.load(std::memory_order_acquire)) return;
      outstanding_.pop_front();
    }
  }

  /// Breaks the connection's sending side: queued pieces are dropped, posted sends
  /// cancelled and drained, so that the provider no longer reads the caller's bodies.
  void abort_sends() {
    int expected = 0;
    shared_->send_error.compare_exchange_strong(expected, FI_ECANCELED);
    for (auto& p : backlog_) {
      p.op->err = FI_ECANCELED;
      p.op->done.store(true, std::memory_order_release);
    }
    backlog_.clear();
    auto all_done = [&] {
      for (auto& m : outstanding_)
        for (auto& op : m.ops)
          if (!op->done.load(std::memory_order_acquire)) return false;
      return true;
    };
    if (all_done()) {
      outstanding_.clear();
      return;
    }
    for (auto& m : outstanding_)
      for (auto& op : m.ops) ep_->cancel(*op);
    if (!ep_->wait(all_done, deadline_in(200ms), nullptr, "cancel sends").ok())
      KVS_LOG_ERROR("libfabric: a send from a caller's buffer to {} could not be cancelled", peer_name_);
    outstanding_.clear();
  }

  Status fail_body(const Status& st) {
    bool any_ok = false, all_ok = !body_ops_.empty();
    for (auto& o : body_ops_) {
      const bool ok = o->done.load() && o->err == 0;
      any_ok |= ok;
      all_ok &= ok;
    }
    if (all_ok) {  // it completed while we cancelled: that is success
      body_ops_.clear();
      body_pending_ = false;
      return {};
    }
    if (any_ok) broken_ = "a body was partly received before a timeout or cancel";
    body_ops_.clear();  // nothing consumed: the caller may call recv_body again
    return st;
  }

  Result<size_t> corrupt(std::string_view what) {
    broken_ = fmt::format("{} from {}", what, peer_name_);
    return make_status(StatusCode::corrupt_data, "libfabric: {}", broken_);
  }

  std::shared_ptr<Endpoint> ep_;
  fi_addr_t peer_;
  uint32_t id_;
  std::string peer_name_;
  bool owns_endpoint_;
  std::shared_ptr<ConnShared> shared_;
  std::shared_ptr<Op> bye_op_;
  // Sender side.
  uint64_t send_seq_ = 0;          // messages posted
  std::deque<Piece> backlog_;       // pieces waiting for room in the provider's queue
  std::deque<Msg> outstanding_;     // posted messages not yet known complete
  // Receiver side.
  uint64_t recv_seq_ = 0;
  std::shared_ptr<Op> hdr_op_;
  std::vector<std::shared_ptr<Op>> body_ops_;
  bool body_pending_ = false;
  uint64_t body_size_ = 0;
  std::string broken_;
};

// ---- Listener ---------------------------------------------------------------------------

struct ListenShared {
  std::mutex mu;
  std::deque<Hello> hellos;
  bool closing = false;
};

class OfiListener final : public Listener {
 public:
  OfiListener(std::shared_ptr<Endpoint> ep, std::string address, int reserved_fd)
      : ep_(std::move(ep)), address_(std::move(address)), reserved_fd_(reserved_fd),
        shared_(std::make_shared<ListenShared>()) {}

  ~OfiListener() override {
    pending_.reset();  // a handshake no accept() finished: its connection says bye
    {
      std::lock_guard lock(shared_->mu);
      shared_->closing = true;
    }
    for (auto& op : hello_ops_) ep_->cancel_and_drain(*op, 1s);
    if (reserved_fd_ >= 0) ::close(reserved_fd_);
  }

  Status start() {
    for (size_t i = 0; i < kHelloPool; ++i) KVS_RETURN_IF_ERROR(post_hello());
    return {};
  }

  /// The caller's deadline bounds the wait for a connection, not the life of one that
  /// came: a hello taken from the queue is the client's only connection request, so a
  /// deadline or cancel that ends this call before its hello-ack completes keeps the
  /// handshake pending, and the next call finishes it before waiting for another (one
  /// whose ack has not completed within kHandshakeLimit is dropped, unavailable).
  /// Dropping it at the caller's deadline lost connections the client already counted
  /// as made: the storage node accepts in 200 ms rounds, and under TSan the first send
  /// on a new tcp;ofi_rxm listener endpoint (the first hello-ack) takes about 100 ms.
  Result<std::unique_ptr<Connection>> accept(Deadline deadline, const CancelToken& cancel) override {
    if (!pending_) {
      Hello h{};
      KVS_RETURN_IF_ERROR(ep_->wait(
          [&] {
            std::lock_guard lock(shared_->mu);
            if (shared_->hellos.empty()) return false;
            h = shared_->hellos.front();
            shared_->hellos.pop_front();
            return true;
          },
          deadline, &cancel, "accept"));
      refill_hellos();
      KVS_ASSIGN_OR_RETURN(pending_, begin_handshake(h));
    }
    if (Status st = finish_handshake(deadline, cancel); !st.ok()) {
      if (st.code() != StatusCode::timed_out && st.code() != StatusCode::cancelled) pending_.reset();
      return st;
    }
    auto hs = std::move(pending_);
    KVS_LOG_DEBUG("libfabric: accepted {} as connection {}", hs->conn->describe(), hs->id);
    return std::unique_ptr<Connection>(std::move(hs->conn));
  }

  std::string address() const override { return address_; }

 private:
  static constexpr size_t kHelloPool = 8;  // hello receives kept posted
  static constexpr auto kHandshakeLimit = 10s;  // for a taken hello's ack to complete

  /// A connection whose hello was taken and whose hello-ack has not completed yet.
  struct Handshake {
    std::unique_ptr<OfiConnection> conn;
    std::shared_ptr<Op> ack;
    void* desc = nullptr;
    fi_addr_t peer = FI_ADDR_UNSPEC;
    uint64_t tag = 0;
    uint32_t id = 0;
    bool posted = false;  // the ack is with the provider
    Deadline give_up{};   // kHandshakeLimit after the hello was taken
  };

  Result<std::unique_ptr<Handshake>> begin_handshake(const Hello& h) {
    auto hs = std::make_unique<Handshake>();
    hs->give_up = deadline_in(kHandshakeLimit);
    KVS_ASSIGN_OR_RETURN(hs->peer, ep_->insert(h.addr));
    hs->id = next_id_++ & uint32_t(kConnMask);
    hs->conn = std::make_unique<OfiConnection>(ep_, hs->peer, hs->id, strip_scheme(ep_->straddr(h.addr)), false);
    KVS_RETURN_IF_ERROR(hs->conn->start());
    // The ack, tagged with the client's nonce, tells it its connection id.
    hs->ack = ep_->new_op(sizeof(HelloAck));
    const HelloAck ack{kHelloMagic, hs->id};
    std::memcpy(hs->ack->buf.get(), &ack, sizeof ack);
    KVS_ASSIGN_OR_RETURN(hs->desc, ep_->local_desc(*hs->ack));
    hs->tag = make_tag(MsgType::hello_ack, 0) | (h.nonce & kLow60);
    return hs;
  }

  /// Posts the pending handshake's ack (if not yet posted) and waits for it to complete.
  /// timed_out or cancelled leave it pending; both make progress even past the deadline
  /// (one post attempt, one poll), so a caller that keeps calling gets through.
  Status finish_handshake(Deadline deadline, const CancelToken& cancel) {
    Handshake& hs = *pending_;
    Status st;
    const Deadline until = std::min(deadline, hs.give_up);
    if (!hs.posted) {
      st = ep_->post_send(hs.ack, hs.ack->buf.get(), sizeof(HelloAck), hs.desc, hs.peer, hs.tag, until, cancel);
      hs.posted = st.ok();
    }
    if (st.ok())
      st = ep_->wait([&] { return hs.ack->done.load(std::memory_order_acquire); }, until, &cancel,
                     "accept (hello-ack)");
    if (st.code() == StatusCode::timed_out && Clock::now() >= hs.give_up)
      return make_status(StatusCode::unavailable, "libfabric: hello-ack to {} did not complete in {} s",
                         hs.conn->describe(), kHandshakeLimit.count());
    KVS_RETURN_IF_ERROR(st);
    if (hs.ack->err)
      return make_status(StatusCode::unavailable, "libfabric: hello-ack to {} failed: {}", hs.conn->describe(),
                         fi_err(hs.ack->err));
    return {};
  }

  /// Keeps kHelloPool hello receives posted (one completes per hello, and one that
  /// completes with an error or a bad hello is replaced too). A failed repost is logged,
  /// not fatal: the hello already taken is still accepted, and the next call retries.
  void refill_hellos() {
    reap_hello_ops();
    while (hello_ops_.size() < kHelloPool)
      if (Status s = post_hello(); !s.ok()) {
        KVS_LOG_WARN("libfabric: listener {} could not repost a hello receive: {}", address_, s.to_string());
        break;
      }
  }

  Status post_hello() {
    auto op = ep_->new_op(sizeof(Hello));
    auto sh = shared_;
    op->on_complete = [sh](Op& o) {
      if (o.err || o.len < offsetof(Hello, addr)) return;
      Hello h{};
      std::memcpy(&h, o.buf.get(), std::min(o.len, sizeof h));
      if (h.magic != kHelloMagic || h.addr_len > kMaxAddrBytes) return;
      std::lock_guard lock(sh->mu);
      if (!sh->closing) sh->hellos.push_back(h);
    };
    KVS_ASSIGN_OR_RETURN(void* desc, ep_->local_desc(*op));
    KVS_RETURN_IF_ERROR(
        ep_->post_recv(op, op->buf.get(), sizeof(Hello), desc, make_tag(MsgType::hello, 0), kLow60, deadline_in(5s)));
    hello_ops_.push_back(std::move(op));
    return {};
  }
  void reap_hello_ops() {
    std::erase_if(hello_ops_, [](const std::shared_ptr<Op>& o) { return o->done.load(); });
  }

  std::shared_ptr<Endpoint> ep_;
  std::string address_;
  int reserved_fd_;
  std::shared_ptr<ListenShared> shared_;
  std::vector<std::shared_ptr<Op>> hello_ops_;
  uint32_t next_id_ = 1;
  std::unique_ptr<Handshake> pending_;  // taken hello whose ack a deadline interrupted
};

// ---- Backend ------------------------------------------------------------------------------

struct InfoPtr {
  fi_info* p = nullptr;
  ~InfoPtr() {
    if (p) fi_freeinfo(p);
  }
};

class OfiBackend final : public Backend {
 public:
  explicit OfiBackend(std::shared_ptr<Core> core) : core_(std::move(core)) {
    caps_.backend = "libfabric";
    caps_.provider = core_->provider;
    caps_.host_memory = true;
    caps_.cuda_memory = core_->hmem;
    caps_.one_sided_read = core_->rma;  // FI_RMA reads (MemoryRegion::expose + Connection::read)
    caps_.notifications = false;
    caps_.max_message_bytes = std::min<uint64_t>(uint64_t(core_->segment) * kSegMask, uint64_t(1) << 40);
  }

  const Capabilities& capabilities() const override { return caps_; }

  Result<std::unique_ptr<Listener>> listen(const std::string& address) override {
    std::string host;
    uint16_t port = 0;
    KVS_RETURN_IF_ERROR(parse_host_port(address, host, port));
    int reserved = -1;
    const bool sockaddr = core_->info->addr_format == FI_SOCKADDR_IN || core_->info->addr_format == FI_SOCKADDR_IN6 ||
                          core_->info->addr_format == FI_SOCKADDR;
    if (port == 0 && !sockaddr) {
      // Providers with name-based addresses (shm: "fi_ns://host:port") do not pick a
      // free port: reserve one from the kernel for as long as the listener lives.
      KVS_ASSIGN_OR_RETURN(reserved, reserve_port(host, port));
    }
    InfoPtr info;
    const std::string service = std::to_string(port);
    int r = fi_getinfo(kFiVersion, host.c_str(), service.c_str(), FI_SOURCE, core_->hints, &info.p);
    if (r) {
      if (reserved >= 0) ::close(reserved);
      return make_status(StatusCode::unavailable, "libfabric: cannot listen on {} with {}: {}", address,
                         core_->provider, fi_err(r));
    }
    auto ep = Endpoint::open(core_, info.p);
    if (!ep.ok()) {
      if (reserved >= 0) ::close(reserved);
      return ep.status().with_context(fmt::format("listen on {}", address));
    }
    if (sockaddr) {
      auto name = (*ep)->name();
      if (!name.ok()) return name.status();
      port = port_of(*name).value_or(port);
    }
    auto l = std::make_unique<OfiListener>(std::move(ep).value(), fmt::format("{}:{}", host, port), reserved);
    KVS_RETURN_IF_ERROR(l->start());
    KVS_LOG_DEBUG("libfabric: listening on {} ({})", l->address(), core_->provider);
    return std::unique_ptr<Listener>(std::move(l));
  }

  Result<std::unique_ptr<Connection>> connect(const std::string& address, Deadline deadline,
                                              const CancelToken& cancel) override {
    std::string host;
    uint16_t port = 0;
    KVS_RETURN_IF_ERROR(parse_host_port(address, host, port));
    InfoPtr info;
    const std::string service = std::to_string(port);
    int r = fi_getinfo(kFiVersion, host.c_str(), service.c_str(), 0, core_->hints, &info.p);
    if (r || !info.p->dest_addr)
      return make_status(StatusCode::unavailable, "libfabric: cannot resolve {} with {}: {}", address,
                         core_->provider, fi_err(r ? r : -FI_EADDRNOTAVAIL));
    KVS_ASSIGN_OR_RETURN(auto ep, Endpoint::open(core_, info.p));
    KVS_ASSIGN_OR_RETURN(fi_addr_t server, ep->insert(info.p->dest_addr));
    KVS_ASSIGN_OR_RETURN(auto me, ep->name());
    if (me.size() > kMaxAddrBytes)
      return make_status(StatusCode::internal, "libfabric: endpoint address of {} bytes is too long", me.size());
    uint64_t nonce = 0;
    {
      std::random_device rd;
      nonce = ((uint64_t(rd()) << 32) ^ rd() ^ uint64_t(Clock::now().time_since_epoch().count())) & kLow60;
    }
    // Post the ack receive first, then say hello.
    auto ack = ep->new_op(sizeof(HelloAck));
    KVS_ASSIGN_OR_RETURN(void* adesc, ep->local_desc(*ack));
    KVS_RETURN_IF_ERROR(ep->post_recv(ack, ack->buf.get(), sizeof(HelloAck), adesc,
                                      make_tag(MsgType::hello_ack, 0) | nonce, 0, deadline));
    auto hello = ep->new_op(sizeof(Hello));
    Hello h{};
    h.magic = kHelloMagic;
    h.addr_len = uint32_t(me.size());
    h.nonce = nonce;
    std::memcpy(h.addr, me.data(), me.size());
    std::memcpy(hello->buf.get(), &h, sizeof h);
    KVS_ASSIGN_OR_RETURN(void* hdesc, ep->local_desc(*hello));
    auto fail = [&](Status s) -> Status {
      ep->cancel_and_drain(*ack, 1s);
      return s;
    };
    auto st = ep->post_send(hello, hello->buf.get(), sizeof h, hdesc, server, make_tag(MsgType::hello, 0), deadline,
                            cancel);
    if (!st.ok()) return fail(st.with_context(fmt::format("connect to {}", address)));
    st = ep->wait([&] { return ack->done.load() || (hello->done.load() && hello->err); }, deadline, &cancel,
                  fmt::format("connect to {}", address));
    if (!st.ok()) return fail(st);
    if (hello->done.load() && hello->err)
      return fail(make_status(StatusCode::unavailable, "libfabric: connect to {} failed: {}", address,
                              fi_err(hello->err)));
    HelloAck a{};
    std::memcpy(&a, ack->buf.get(), sizeof a);
    if (ack->err || ack->len != sizeof a || a.magic != kHelloMagic)
      return make_status(StatusCode::unavailable, "libfabric: bad hello-ack from {}", address);
    auto conn = std::make_unique<OfiConnection>(ep, server, a.conn_id, fmt::format("{}:{}", host, port), true);
    KVS_RETURN_IF_ERROR(conn->start());
    KVS_LOG_DEBUG("libfabric: connected to {} as connection {}", address, a.conn_id);
    return std::unique_ptr<Connection>(std::move(conn));
  }

  Result<MemoryRegion> register_memory(void* data, size_t size, MemoryType type) override {
    if (!data || size == 0)
      return make_status(StatusCode::invalid_argument, "libfabric: cannot register an empty or null buffer");
    if (type == MemoryType::cuda && !core_->hmem)
      return make_status(StatusCode::unsupported,
                         "libfabric: provider {} has no FI_HMEM support, so cuda memory cannot be registered",
                         core_->provider);
    if (auto hit = cache_.find(data, size, type)) return RegionAccess::wrap(hit);
    auto region = std::make_shared<OfiRegion>();
    region->core = core_;
    region->data = static_cast<std::byte*>(data);
    region->size = size;
    region->type = type;
    uint64_t access = FI_SEND | FI_RECV;
    if (core_->rma) access |= FI_READ | FI_REMOTE_READ;
    iovec iov{data, size};
    fi_mr_attr attr{};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = access;
    attr.requested_key = core_->next_key.fetch_add(1);
    attr.iface = type == MemoryType::cuda ? FI_HMEM_CUDA : FI_HMEM_SYSTEM;
    int r = fi_mr_regattr(core_->domain, &attr, 0, &region->mr);
    if (r) {
      region->mr = nullptr;
      return make_status(StatusCode::resource_exhausted, "libfabric: fi_mr_reg of {} bytes failed: {}", size,
                         fi_err(r));
    }
    {
      std::lock_guard lock(core_->regions_mu);
      core_->regions[reinterpret_cast<uintptr_t>(data)] = region.get();
    }
    cache_.insert(region);
    return RegionAccess::wrap(region);
  }

 private:
  static std::optional<uint16_t> port_of(const std::vector<unsigned char>& name) {
    if (name.size() >= sizeof(sockaddr_in)) {
      sockaddr_storage ss{};
      std::memcpy(&ss, name.data(), std::min(name.size(), sizeof ss));
      if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    }
    return std::nullopt;
  }

  static Result<int> reserve_port(const std::string& host, uint16_t& port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return make_status(StatusCode::io_error, "libfabric: socket(): {}", std::strerror(errno));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      ::close(fd);
      return make_status(StatusCode::io_error, "libfabric: cannot reserve a port on {}: {}", host,
                         std::strerror(errno));
    }
    port = ntohs(sa.sin_port);
    return fd;
  }

  std::shared_ptr<Core> core_;
  Capabilities caps_;
  RegistrationCache cache_;
};

fi_info* make_hints(const std::string& provider, bool rma, bool hmem) {
  fi_info* h = fi_allocinfo();
  if (!h) return nullptr;
  h->ep_attr->type = FI_EP_RDM;
  h->caps = FI_TAGGED | FI_MSG | (rma ? FI_RMA | FI_READ | FI_REMOTE_READ : 0) | (hmem ? FI_HMEM : 0);
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
                            (hmem ? FI_MR_HMEM : 0);
  h->domain_attr->threading = FI_THREAD_SAFE;
  h->domain_attr->data_progress = FI_PROGRESS_UNSPEC;
  h->fabric_attr->prov_name = strdup(provider.c_str());
  return h;
}

}  // namespace
}  // namespace ofi

Result<std::unique_ptr<Backend>> make_ofi_backend(const BackendConfig& config) {
  using namespace ofi;
  const bool want_cuda = config.memory == MemoryType::cuda;
  auto core = std::make_shared<Core>();
  fi_info* got = nullptr;
  // Prefer RMA reads (a declared capability); fall back to plain tagged messages.
  for (bool rma : {true, false}) {
    fi_info* hints = make_hints(config.libfabric.provider, rma, want_cuda);
    if (!hints) return make_status(StatusCode::resource_exhausted, "libfabric: fi_allocinfo failed");
    int r = fi_getinfo(kFiVersion, nullptr, nullptr, 0, hints, &got);
    if (r == 0 && got) {
      core->hints = hints;
      core->rma = rma;
      break;
    }
    fi_freeinfo(hints);
    got = nullptr;
    if (!rma) {
      if (want_cuda) {
        // Is it the provider or the cuda path that is missing?
        fi_info* plain = make_hints(config.libfabric.provider, false, false);
        fi_info* probe = nullptr;
        const int pr = fi_getinfo(kFiVersion, nullptr, nullptr, 0, plain, &probe);
        if (probe) fi_freeinfo(probe);
        fi_freeinfo(plain);
        if (pr == 0)
          return make_status(StatusCode::unsupported,
                             "libfabric: provider '{}' has no FI_HMEM support, so bodies in cuda memory "
                             "(GPUDirect) are not available",
                             config.libfabric.provider);
      }
      return make_status(StatusCode::unavailable,
                         "libfabric: no provider '{}' offers RDM tagged messages here: {}", config.libfabric.provider,
                         fi_err(r));
    }
  }
  // The fabric and domain of the first match; listen/connect reuse the same hints.
  core->info = got;
  core->provider = got->fabric_attr->prov_name ? got->fabric_attr->prov_name : config.libfabric.provider;
  core->mr_local = (got->domain_attr->mr_mode & FI_MR_LOCAL) || (got->mode & FI_LOCAL_MR);
  core->mr_prov_key = got->domain_attr->mr_mode & FI_MR_PROV_KEY;
  core->mr_virt_addr = got->domain_attr->mr_mode & FI_MR_VIRT_ADDR;
  core->hmem = want_cuda && (got->caps & FI_HMEM);
  core->rma = core->rma && (got->caps & FI_RMA) && (got->caps & FI_READ);
  core->inject = std::min<size_t>(got->tx_attr->inject_size, 4096);
  core->segment = std::min<size_t>(got->ep_attr->max_msg_size ? got->ep_attr->max_msg_size : kMaxSegmentBytes,
                                   kMaxSegmentBytes);
  if (got->domain_attr->mr_mode & FI_MR_ENDPOINT)
    return make_status(StatusCode::unsupported,
                       "libfabric: provider '{}' needs FI_MR_ENDPOINT registrations, which this backend lacks",
                       core->provider);
  // Pin the provider name we got, so listen/connect resolve the same one.
  free(core->hints->fabric_attr->prov_name);
  core->hints->fabric_attr->prov_name = strdup(core->provider.c_str());
  core->hints->domain_attr->mr_mode = got->domain_attr->mr_mode;
  int r = fi_fabric(got->fabric_attr, &core->fabric, nullptr);
  if (r) return make_status(StatusCode::unavailable, "libfabric: fi_fabric({}): {}", core->provider, fi_err(r));
  r = fi_domain(core->fabric, got, &core->domain, nullptr);
  if (r) return make_status(StatusCode::unavailable, "libfabric: fi_domain({}): {}", core->provider, fi_err(r));
  return std::unique_ptr<Backend>(std::make_unique<OfiBackend>(std::move(core)));
}

}  // namespace kvstream::transport

// RDM endpoint, completion queue and progress: see ofi_endpoint.hpp.
#include "transport/ofi/ofi_endpoint.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include "core/log.hpp"
#include "transport/ofi/ofi_shm_local.hpp"

namespace kvstream::transport::ofi {
namespace {

using namespace std::chrono_literals;

Status closed_error() {
  return make_status(StatusCode::unavailable, "libfabric: the endpoint was closed after an interrupted read");
}

/// Strips "fi_sockaddr_in://" and the like from fi_av_straddr's output.
std::string strip_scheme(std::string s) {
  const size_t p = s.find("://");
  return p == std::string::npos ? s : s.substr(p + 3);
}

}  // namespace

Op::~Op() {
  if (mr) fi_close(&mr->fid);
}

Staging::~Staging() {
  if (mr) fi_close(&mr->fid);
}

Result<std::shared_ptr<Staging>> Endpoint::new_staging(size_t size) {
  auto st = std::make_shared<Staging>();
  st->buf = std::make_unique_for_overwrite<std::byte[]>(size);
  st->size = size;
  if (core_->mr_local) {
    int r = fi_mr_reg(core_->domain, st->buf.get(), size, FI_READ | FI_RECV, 0, core_->next_key.fetch_add(1), 0,
                      &st->mr, nullptr);
    if (r) return make_status(StatusCode::resource_exhausted, "libfabric: fi_mr_reg (staging): {}", fi_err(r));
  }
  return st;
}

Result<std::shared_ptr<Endpoint>> Endpoint::open(std::shared_ptr<Core> core, fi_info* info, bool shared) {
  auto e = std::shared_ptr<Endpoint>(new Endpoint(std::move(core), shared));
  KVS_RETURN_IF_ERROR(e->init(info));
  e->progress_ = std::thread([p = e.get()] { p->progress_loop(); });
  return e;
}

Endpoint::~Endpoint() {
  stop_.store(true);
  wake();
  if (progress_.joinable()) progress_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (ep_ && core_->staged_reads && !park_if_reads_linger()) return;
  if (!shm_name_.empty()) {
    // Closed now, or parked while other endpoints of this process hold it (its region
    // stays mapped for their sends: ofi_shm_local.hpp); its own holds end either way.
    shm_endpoint_closing(shm_name_, {std::exchange(ep_, nullptr), std::exchange(cq_, nullptr),
                                     std::exchange(av_, nullptr), core_});
    for (const auto& [addr, name] : shm_holds_) shm_release(name);
  }
  if (ep_) fi_close(&ep_->fid);
  if (cq_) fi_close(&cq_->fid);
  if (av_) fi_close(&av_->fid);
  inflight_.clear();  // the endpoint is closed (or parked, never read again): nothing refers to these any more
}

Status Endpoint::init(fi_info* info) {
  int r = fi_endpoint(core_->domain, info, &ep_, nullptr);
  if (r) return make_status(StatusCode::unavailable, "libfabric: fi_endpoint: {}", fi_err(r));
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  if ((r = fi_av_open(core_->domain, &av_attr, &av_, nullptr)))
    return make_status(StatusCode::unavailable, "libfabric: fi_av_open: {}", fi_err(r));
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.size = 0;
  // A queue the progress thread can sleep on in the kernel where the provider offers
  // one (tcp;ofi_rxm); shm has none (FI_WAIT_FD: not implemented), and its queue is
  // polled as before.
  cq_attr.wait_obj = FI_WAIT_FD;
  if (fi_cq_open(core_->domain, &cq_attr, &cq_, nullptr) == 0) {
    int fd = -1;
    if (fi_control(&cq_->fid, FI_GETWAIT, &fd) == 0 && fd >= 0) {
      wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (wake_fd_ >= 0) wait_fd_ = fd;
    }
  } else {
    cq_ = nullptr;
    cq_attr.wait_obj = FI_WAIT_NONE;
    if ((r = fi_cq_open(core_->domain, &cq_attr, &cq_, nullptr)))
      return make_status(StatusCode::unavailable, "libfabric: fi_cq_open: {}", fi_err(r));
  }
  if ((r = fi_ep_bind(ep_, &av_->fid, 0)))
    return make_status(StatusCode::unavailable, "libfabric: fi_ep_bind(av): {}", fi_err(r));
  if ((r = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV)))
    return make_status(StatusCode::unavailable, "libfabric: fi_ep_bind(cq): {}", fi_err(r));
  if ((r = fi_enable(ep_))) return make_status(StatusCode::unavailable, "libfabric: fi_enable: {}", fi_err(r));
  if (core_->shm()) {
    auto own = name();
    if (!own.ok()) return own.status();
    shm_name_.assign(reinterpret_cast<const char*>(own->data()), own->size());
    shm_name_ = shm_name_.substr(0, shm_name_.find('\0'));
    shm_endpoint_opened(shm_name_);
  }
  // ofi_rxm answers FI_PEEK and FI_PEEK | FI_DISCARD within the call; shm 1.17 never
  // answers a peek for any tag, so its strays are not swept (ofi_strays.hpp).
  sweeps_.store(core_->provider.find("ofi_rxm") != std::string::npos);
  return {};
}

Result<std::vector<unsigned char>> Endpoint::name() {
  std::vector<unsigned char> a(kMaxAddrBytes);
  size_t len = a.size();
  int r = fi_getname(&ep_->fid, a.data(), &len);
  if (r) return make_status(StatusCode::internal, "libfabric: fi_getname: {}", fi_err(r));
  a.resize(len);
  return a;
}

Result<std::string> Endpoint::address_key(const void* addr, size_t len) const {
  const auto* p = static_cast<const char*>(addr);
  const uint32_t format = core_->info->addr_format;
  if (format == FI_ADDR_STR) return std::string(p, ::strnlen(p, len));
  if (core_->sockaddr_names() && len >= sizeof(sa_family_t)) {
    sa_family_t family = 0;
    std::memcpy(&family, p, sizeof family);
    if (family == AF_INET && len >= sizeof(sockaddr_in)) {
      sockaddr_in in{};
      std::memcpy(&in, p, sizeof in);
      std::memset(in.sin_zero, 0, sizeof in.sin_zero);
      return std::string(reinterpret_cast<const char*>(&in), sizeof in);
    }
    if (family == AF_INET6 && len >= sizeof(sockaddr_in6)) return std::string(p, sizeof(sockaddr_in6));
    return make_status(StatusCode::invalid_argument,
                       "libfabric: a peer address of {} bytes and family {} is no socket address", len, family);
  }
  return std::string(p, len);
}

Result<PeerTable::Use> Endpoint::peer(const void* addr, size_t len) {
  KVS_ASSIGN_OR_RETURN(std::string key, address_key(addr, len));
  // Before the table: an entry made while the name's endpoint was open maps its
  // memory just as the provider's stale list does.
  if (core_->shm() && shm_name_was_closed(key))
    return make_status(StatusCode::unavailable,
                       "libfabric: shm endpoint '{}' was closed in this process, and the provider keeps its "
                       "unmapped memory under that name, so this process cannot reach an endpoint of that name "
                       "again (listen on another port)",
                       shm_list_name(key));
  std::lock_guard lock(av_mu_);
  if (auto use = peers_->find(key)) return std::move(*use);
  remove_unused_peers_locked();
  fi_addr_t fa = FI_ADDR_UNSPEC;
  const int r = locked([&] { return fi_av_insert(av_, key.c_str(), 1, &fa, 0, nullptr); });
  if (r != 1) return make_status(StatusCode::unavailable, "libfabric: fi_av_insert failed: {}", fi_err(r));
  if (core_->shm() && shm_hold(key)) shm_holds_[fa] = key;  // a peer in this process
  return peers_->add(std::move(key), fa);
}

void Endpoint::remove_unused_peers() {
  std::lock_guard lock(av_mu_);
  remove_unused_peers_locked();
}

void Endpoint::remove_unused_peers_locked() {
  for (fi_addr_t a : peers_->take_unused()) {
    if (const int r = locked([&] { return fi_av_remove(av_, &a, 1, 0); }); r) {
      KVS_LOG_DEBUG("libfabric: fi_av_remove of a peer no connection uses: {}", fi_err(r));
      continue;  // still in the vector: a hold of a peer in this process stays until the close
    }
    if (auto h = shm_holds_.find(a); h != shm_holds_.end()) {
      shm_release(h->second);
      shm_holds_.erase(h);
    }
  }
}

size_t Endpoint::peer_count() {
  remove_unused_peers();
  return peers_->size();
}

std::string Endpoint::peer_name(const void* addr) {
  char buf[256];
  size_t len = sizeof buf;
  fi_av_straddr(av_, addr, buf, &len);
  buf[sizeof buf - 1] = 0;
  return strip_scheme(buf);
}

std::shared_ptr<Op> Endpoint::new_op(size_t buf_size) {
  auto op = std::make_shared<Op>();
  if (buf_size) {
    op->buf = std::make_shared_for_overwrite<std::byte[]>(buf_size);
    op->buf_size = buf_size;
  }
  return op;
}

Result<void*> Endpoint::local_desc(Op& op) {
  if (!core_->mr_local || !op.buf) return static_cast<void*>(nullptr);
  if (!op.mr) {
    int r = fi_mr_reg(core_->domain, op.buf.get(), op.buf_size, FI_SEND | FI_RECV, 0, core_->next_key.fetch_add(1),
                      0, &op.mr, nullptr);
    if (r) return make_status(StatusCode::resource_exhausted, "libfabric: fi_mr_reg (internal): {}", fi_err(r));
  }
  return fi_mr_desc(op.mr);
}

template <typename Attempt>
Status Endpoint::retry_post(Attempt attempt, std::string_view call, std::string_view what, Deadline deadline,
                            const CancelToken& cancel) {
  for (Backoff backoff;;) {
    const ssize_t r = locked(attempt);
    if (r == 0) return {};
    if (r != -FI_EAGAIN) return make_status(StatusCode::unavailable, "libfabric: {}: {}", call, fi_err(int(r)));
    KVS_RETURN_IF_ERROR(wait_verdict(deadline, &cancel, "libfabric", what));
    if (poll() == 0) backoff.pause();
  }
}

Status Endpoint::post_recv(const std::shared_ptr<Op>& op, void* buf, size_t len, void* desc, uint64_t tag,
                           uint64_t ignore, Deadline deadline, fi_addr_t src, std::optional<size_t> keep_queued_up_to) {
  if (!ep_) return closed_error();
  op->peer = peers_->hold(src);
  if (!core_->directed_recv) src = FI_ADDR_UNSPEC;
  track(op);
  const bool guard = core_->cleared_bodies && sweeps_.load();
  std::vector<Reaped> got;
  for (Backoff backoff;;) {
    ssize_t r = 0;
    {
      std::lock_guard fl(fi_mu_);
      if (guard) r = discard_oversized_locked(tag, ignore, src, keep_queued_up_to.value_or(len), got);
      if (r == 0) r = fi_trecv(ep_, buf, len, desc, src, tag, ignore, &op->ctx);
    }
    defer(got);
    if (r == 0) return {};
    if (r != -FI_EAGAIN || Clock::now() >= deadline) {
      untrack(op.get());
      return make_status(r == -FI_EAGAIN ? StatusCode::timed_out : StatusCode::io_error, "libfabric: fi_trecv: {}",
                         fi_err(int(r)));
    }
    if (poll() == 0) backoff.pause();
  }
}

Status Endpoint::post_send(const std::shared_ptr<Op>& op, const void* buf, size_t len, void* desc, fi_addr_t dest,
                           uint64_t tag, Deadline deadline, const CancelToken& cancel) {
  if (!ep_) return closed_error();
  op->peer = peers_->hold(dest);
  track(op);
  if (op->counted) {
    active_sends_.fetch_add(1);
    wake();
  }
  Status s = retry_post([&] { return fi_tsend(ep_, buf, len, desc, dest, tag, &op->ctx); }, "fi_tsend",
                        "send (provider queue full)", deadline, cancel);
  if (!s.ok() && untrack(op.get()) && op->counted) active_sends_.fetch_sub(1);
  return s;
}

Status Endpoint::post_read(const std::shared_ptr<Op>& op, void* buf, size_t len, void* desc, fi_addr_t src,
                           uint64_t addr, uint64_t key, Deadline deadline, const CancelToken& cancel) {
  if (!ep_) return closed_error();
  op->peer = peers_->hold(src);
  track(op);
  Status s = retry_post([&] { return fi_read(ep_, buf, len, desc, src, addr, key, &op->ctx); }, "fi_read",
                        "read (provider queue full)", deadline, cancel);
  if (!s.ok()) untrack(op.get());
  return s;
}

ssize_t Endpoint::try_send(const std::shared_ptr<Op>& op, const void* buf, size_t len, void* desc, fi_addr_t dest,
                           uint64_t tag) {
  if (!ep_) return -FI_ESHUTDOWN;
  op->peer = peers_->hold(dest);
  track(op);
  op->counted = true;
  active_sends_.fetch_add(1);
  const ssize_t r = locked([&] { return fi_tsend(ep_, buf, len, desc, dest, tag, &op->ctx); });
  if (r == 0) {
    wake();
    return 0;
  }
  if (untrack(op.get())) active_sends_.fetch_sub(1);
  op->counted = false;
  return r;
}

ssize_t Endpoint::try_inject(const void* buf, size_t len, fi_addr_t dest, uint64_t tag) {
  if (!ep_) return -FI_ESHUTDOWN;
  return locked([&] { return fi_tinject(ep_, buf, len, dest, tag); });
}

void Endpoint::cancel(Op& op) {
  if (ep_ && !op.done.load(std::memory_order_acquire)) locked([&] { return fi_cancel(&ep_->fid, &op.ctx); });
}

bool Endpoint::cancel_and_drain(Op& op, std::chrono::milliseconds limit) {
  if (op.done.load(std::memory_order_acquire)) return true;
  if (!ep_) return false;  // closed: the provider dropped it (our buffer, never reused)
  locked([&] { return fi_cancel(&ep_->fid, &op.ctx); });
  return wait([&] { return op.done.load(std::memory_order_acquire); }, deadline_in(limit), nullptr, "cancel").ok();
}

bool Endpoint::park_if_reads_linger() {
  // Only staged reads (their operations keep a staging buffer) matter: a posted
  // receive or a send is closed under as before.
  auto busy = [&] {
    std::lock_guard lock(mu_);
    return std::any_of(inflight_.begin(), inflight_.end(), [](const auto& e) { return e.second->keep != nullptr; });
  };
  const auto until = deadline_in(200ms);
  while (busy() && Clock::now() < until)
    if (poll() == 0) std::this_thread::sleep_for(1ms);
  if (!busy()) return true;
  // ofi_rxm crashed in fi_close with an RMA read in flight (Core::staged_reads): the
  // endpoint, its queues and the reads' buffers stay as they are, for the process's
  // life: a bounded leak per stalled peer instead of a crash of the host.
  std::lock_guard lock(mu_);
  KVS_LOG_WARN("libfabric: a read is still in flight from a silent peer; its endpoint is left open");
  new std::unordered_map<Op*, std::shared_ptr<Op>>(std::move(inflight_));  // NOLINT: deliberately never freed
  return false;
}

void Endpoint::close_now() {
  if (!ep_) return;
  stop_.store(true);
  wake();
  if (progress_.joinable()) progress_.join();
  fi_close(&ep_->fid);
  ep_ = nullptr;
}

int Endpoint::read_locked(std::vector<Reaped>& out) {
  fi_cq_tagged_entry e[16];
  const ssize_t n = fi_cq_read(cq_, e, 16);
  if (n > 0) {
    for (ssize_t i = 0; i < n; ++i) out.push_back({e[i].op_context, 0, e[i].len, e[i].tag});
    return int(n);
  }
  fi_cq_err_entry err{};
  if (n == -FI_EAVAIL && fi_cq_readerr(cq_, &err, 0) == 1) {
    out.push_back({err.op_context, err.err ? err.err : FI_EIO, err.len, err.tag});
    return 1;
  }
  return 0;
}

void Endpoint::route(const std::vector<Reaped>& got) {
  for (const Reaped& r : got) {
    // FI_ENOMSG: a stray sweep's peek found nothing (ofi_strays.cpp), the usual answer.
    if (r.err && r.err != FI_ECANCELED && r.err != FI_ENOMSG)
      KVS_LOG_DEBUG("libfabric: completion error {}", fi_err(r.err));
    complete(r.context, r.err, r.len, r.tag);
  }
}

int Endpoint::poll() {
  std::vector<Reaped> got;
  got.reserve(16);
  if (has_deferred_.load(std::memory_order_acquire)) {
    std::lock_guard lock(deferred_mu_);
    got.swap(deferred_);
    has_deferred_.store(false, std::memory_order_release);
  }
  {
    std::lock_guard fl(fi_mu_);
    read_locked(got);
  }
  route(got);
  return int(got.size());
}

void Endpoint::defer(std::vector<Reaped>& got) {
  if (got.empty()) return;
  {
    std::lock_guard lock(deferred_mu_);
    deferred_.insert(deferred_.end(), got.begin(), got.end());
    has_deferred_.store(true, std::memory_order_release);
  }
  got.clear();
  wake();  // the progress thread may sleep on the queue these were read off
}

void Endpoint::track(const std::shared_ptr<Op>& op) {
  std::lock_guard lock(mu_);
  inflight_[op.get()] = op;
}

bool Endpoint::untrack(Op* op) {
  std::lock_guard lock(mu_);
  return inflight_.erase(op) > 0;
}

void Endpoint::complete(void* context, int err, size_t len, uint64_t tag) {
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
  if (op->quiet) return;  // a sweep's peek: its sweep polls for it, and it is no work
  // Counted only where something watches the count (a blocking queue's parked
  // callers and idle timer), after the state a waiter's predicate reads has changed.
  // Dekker-style with park(): either it sees the new count or this sees it parked.
  if (wait_fd_ < 0) return;
  completions_.fetch_add(1);
  if (parked_.load() > 0) {
    std::lock_guard lock(park_mu_);
    park_cv_.notify_all();
  }
}

void Endpoint::park(uint64_t seen, Deadline deadline) {
  const Deadline until = std::min(deadline, Clock::now() + 5ms);
  std::unique_lock lock(park_mu_);
  parked_.fetch_add(1);
  park_cv_.wait_until(lock, until, [&] { return completions_.load() != seen || stop_.load(); });
  parked_.fetch_sub(1);
}

void Endpoint::wake() {
  // Only a progress thread on its way into poll(2) needs the eventfd; one awake checks
  // active_sends_ and stop_ before it sleeps again.
  if (wait_fd_ >= 0 && asleep_.exchange(false)) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }
  std::lock_guard lock(wake_mu_);
  kick_ = true;
  wake_cv_.notify_one();
}

void Endpoint::progress_loop() {
  Backoff backoff;
  // While completions come, 1 ms naps between polls (a thread woken by every event
  // competes with the waiting callers that reap their own: a 4 KiB ping-pong took 3x
  // as long); after kParkAfter without one, the kernel's wait on the queue's fd.
  // Completions reaped by waiting callers count as work too: on a receiving side the
  // callers reap nearly all of them. (No idle timer on a queue without a wait fd.)
  auto last_work = Clock::now();
  uint64_t seen = completions_.load();
  while (!stop_.load()) {
    const bool reaped = poll() > 0;
    const bool sending = active_sends_.load() > 0;
    // Entries whose last user went (a closed connection's last operation): removed
    // here, unless an insert holds the vector now (the next round does it then).
    if (peers_->unused() > 0)
      if (std::unique_lock lock(av_mu_, std::try_to_lock); lock) remove_unused_peers_locked();
    // A sweep that dropped strays is work: a flood brings no completions, and the
    // thread would otherwise sleep on the queue while it piles up.
    const bool swept = sweep_when_due() > 0;
    if (const uint64_t c = completions_.load(); wait_fd_ >= 0 && (c != seen || reaped || sending || swept)) {
      seen = c;
      last_work = Clock::now();
    }
    if (reaped || swept) {
      backoff.reset();
      continue;
    }
    if (sending) {
      backoff.pause();
      continue;
    }
    if (wait_fd_ >= 0 && Clock::now() - last_work >= kParkAfter) {
      sleep_on_queue(50ms);
      backoff.reset();
      continue;
    }
    std::unique_lock lock(wake_mu_);
    wake_cv_.wait_for(lock, 1ms, [&] { return kick_ || stop_.load(); });
    kick_ = false;
    backoff.reset();
  }
}

void Endpoint::sleep_on_queue(std::chrono::milliseconds limit) {
  // asleep_ first, then the checks: a sender that counts itself after them finds
  // asleep_ set and writes the eventfd (wake()).
  asleep_.store(true);
  if (stop_.load() || active_sends_.load() > 0) {
    asleep_.store(false);
    return;
  }
  fid* queue = &cq_->fid;
  const int r = locked([&] { return fi_trywait(core_->fabric, &queue, 1); });
  // fi_trywait's -FI_EAGAIN: the provider has work its fd does not show; poll again
  // within a millisecond (a kick still ends the wait at once).
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {wait_fd_, POLLIN, 0}};
  ::poll(fds, r == FI_SUCCESS ? 2 : 1, r == FI_SUCCESS ? int(limit.count()) : 1);
  if (fds[0].revents & POLLIN) {
    uint64_t n;
    (void)!::read(wake_fd_, &n, sizeof n);
  }
  asleep_.store(false);
}

}  // namespace kvstream::transport::ofi

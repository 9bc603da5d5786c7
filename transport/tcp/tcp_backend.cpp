// tcp backend over io_uring. Framing: transport/tcp/tcp_framing.hpp, docs/wire-tcp.md.
#include "transport/tcp/tcp_backend.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <liburing.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "core/log.hpp"
#include "transport/backends.hpp"
#include "transport/common/address.hpp"
#include "transport/common/registration.hpp"
#include "transport/common/wait.hpp"
#include "transport/ring_lifetime.hpp"
#include "transport/tcp/tcp_framing.hpp"

namespace kvstream::transport {
namespace tcp {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

/// unavailable for errors that mean "the peer or the path is gone", io_error otherwise.
StatusCode code_for_errno(int err) {
  switch (err) {
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN:
    case ECONNABORTED:
    case ECONNREFUSED:
    case ESHUTDOWN:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
      return StatusCode::unavailable;
    default:
      return StatusCode::io_error;
  }
}


void configure_socket(int fd, const TcpSettings& opt) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (opt.socket_buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &opt.socket_buffer_bytes, sizeof opt.socket_buffer_bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &opt.socket_buffer_bytes, sizeof opt.socket_buffer_bytes);
  }
}

// ---- io_uring helpers ----------------------------------------------------------------

/// One io_uring, used by one thread at a time (callers hold the direction's mutex).
class Ring {
 public:
  Ring() = default;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() {
    if (ready_) {
      note_ring_unmapped();
      io_uring_queue_exit(&ring_);
    }
  }

  /// `coop`: IORING_SETUP_COOP_TASKRUN, i.e. operations continue (a send after its
  /// socket had room again, the next link of a chain) only when this thread enters
  /// the kernel; saves an interrupt per step. Right for rings that are only used
  /// by a thread waiting on them; not for the send ring, whose posted messages must
  /// keep moving while the caller does something else (even sleeps elsewhere).
  Status init(unsigned depth, bool coop = true) {
    int rc = io_uring_queue_init(depth, &ring_, coop ? IORING_SETUP_COOP_TASKRUN : 0);
    if (rc == -EINVAL && coop) rc = io_uring_queue_init(depth, &ring_, 0);  // older kernel
    if (rc < 0)
      return make_status(StatusCode::unavailable, "tcp: io_uring_queue_init({}) failed: {}", depth, errno_text(-rc));
    ready_ = true;
    note_ring_mapped();
    return {};
  }

  io_uring* get() { return &ring_; }
  uint64_t next_id() { return ++last_id_; }

  /// A free SQE (flushing the queue if it is full).
  io_uring_sqe* sqe() {
    io_uring_sqe* s = io_uring_get_sqe(&ring_);
    if (!s) {
      io_uring_submit(&ring_);
      s = io_uring_get_sqe(&ring_);
    }
    return s;
  }

 private:
  io_uring ring_{};
  bool ready_ = false;
  uint64_t last_id_ = 0;
};

struct Completion {
  uint64_t user_data = 0;
  int res = 0;
  uint32_t flags = 0;
};

/// Submits what is queued and waits for the next completion, in slices of at most
/// kTcpWaitSlice. Errors: timed_out at `deadline`, cancelled when `cancel` fires
/// (nothing is reaped then), io_error when the ring itself fails.
Status next_completion(Ring& ring, Completion& out, Deadline deadline, const CancelToken* cancel) {
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    if (io_uring_peek_cqe(ring.get(), &cqe) == 0 && cqe) {
      out = Completion{cqe->user_data, cqe->res, cqe->flags};
      io_uring_cqe_seen(ring.get(), cqe);
      return {};
    }
    if (cancel && cancel->cancelled()) return Status(StatusCode::cancelled, "cancelled");
    const auto now = Clock::now();
    if (now >= deadline) return Status(StatusCode::timed_out, "deadline passed");
    const auto slice = std::min<Clock::duration>(deadline - now, kTcpWaitSlice);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
    __kernel_timespec ts{};
    ts.tv_sec = ns / 1000000000;
    ts.tv_nsec = std::max<long long>(ns % 1000000000, ns > 0 ? 0 : 1000);
    const int rc = io_uring_submit_and_wait_timeout(ring.get(), &cqe, 1, &ts, nullptr);
    if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
      return make_status(StatusCode::io_error, "io_uring wait failed: {}", errno_text(-rc));
  }
}

/// Runs the submitted operation `id` to its end: its result and, for zero-copy
/// sends, the notification that the kernel no longer reads the buffers. On a
/// deadline or cancel the operation is cancelled in the kernel and reaped before
/// this returns, so nothing writes to (or reads from) caller memory afterwards;
/// `res` then holds what the operation did anyway (bytes moved, or -ECANCELED) and
/// `got` whether it reported at all. When the kernel does not let go within a
/// second, the socket is shut down, which ends any socket operation.
Status await_op(Ring& ring, int fd, uint64_t id, Deadline deadline, const CancelToken& cancel, int& res, bool& got) {
  got = false;
  bool need_notif = false;
  Status st;
  for (;;) {
    Completion c;
    st = next_completion(ring, c, deadline, &cancel);
    if (!st.ok()) break;
    if (c.user_data != id) continue;  // a stale completion (an earlier cancel request)
    if (c.flags & IORING_CQE_F_NOTIF) {
      need_notif = false;
    } else {
      res = c.res;
      got = true;
      need_notif = (c.flags & IORING_CQE_F_MORE) != 0;
    }
    if (got && !need_notif) return {};
  }
  if (st.code() != StatusCode::timed_out && st.code() != StatusCode::cancelled) {
    // The ring failed: nothing more can be waited for safely; stop the socket.
    shutdown(fd, SHUT_RDWR);
    return st;
  }
  if (!got) {
    if (io_uring_sqe* s = ring.sqe()) {
      io_uring_prep_cancel64(s, id, 0);
      io_uring_sqe_set_data64(s, ring.next_id());
    }
  }
  bool shut = false;
  Deadline drain_until = Clock::now() + std::chrono::seconds(1);
  const CancelToken never;
  while (!got || need_notif) {
    Completion c;
    Status w = next_completion(ring, c, drain_until, &never);
    if (w.code() == StatusCode::timed_out) {
      if (!shut) {
        shutdown(fd, SHUT_RDWR);
        shut = true;
      } else {
        KVS_LOG_WARN("tcp: still waiting for the kernel to release an operation on fd {}", fd);
      }
      drain_until = Clock::now() + std::chrono::seconds(5);
      continue;
    }
    if (!w.ok()) return w;  // the ring itself failed
    if (c.user_data != id) continue;
    if (c.flags & IORING_CQE_F_NOTIF) {
      need_notif = false;
    } else {
      res = c.res;
      got = true;
      need_notif = (c.flags & IORING_CQE_F_MORE) != 0;
    }
  }
  return st;
}

// ---- memory ---------------------------------------------------------------------------

/// A tcp registration only records the range: sends and receives use ordinary
/// (non-fixed) io_uring buffers, so there is no kernel handle to release.
struct TcpRegion final : MemoryRegion::Impl {};

// ---- connection -----------------------------------------------------------------------

class TcpConnection final : public Connection {
 public:
  TcpConnection(int fd, std::string peer, const TcpSettings& opt) : fd_(fd), peer_(std::move(peer)), opt_(opt) {
    rx_buf_.resize(kTcpRxBufferBytes);
  }
  ~TcpConnection() override {
    // Posted messages nobody waited for: take them back from the kernel first.
    if (tx_ops_ > 0 || !tx_notif_.empty()) tx_abort();
    if (fd_ >= 0) close(fd_);
  }

  Status init(unsigned depth) {
    KVS_RETURN_IF_ERROR(tx_.init(depth, /*coop=*/false));
    return rx_.init(depth);
  }

  /// Connects the (not yet connected) socket to `addr` through the send ring.
  Status connect_to(const sockaddr_storage& addr, Deadline deadline, const CancelToken& cancel) {
    std::lock_guard lock(tx_mu_);
    io_uring_sqe* s = tx_.sqe();
    const uint64_t id = tx_.next_id();
    io_uring_prep_connect(s, fd_, reinterpret_cast<const sockaddr*>(&addr), sockaddr_len(addr));
    io_uring_sqe_set_data64(s, id);
    int res = 0;
    bool got = false;
    Status st = await_op(tx_, fd_, id, deadline, cancel, res, got);
    if (!st.ok()) return st.with_context(fmt::format("tcp: connecting to {}", peer_));
    if (res < 0)
      return make_status(code_for_errno(-res), "tcp: cannot connect to {}: {}", peer_, errno_text(-res));
    return {};
  }

  Result<uint64_t> post_send(std::span<const std::byte> header, std::span<const std::byte> body) override {
    std::lock_guard lock(tx_mu_);
    KVS_RETURN_IF_ERROR(check_usable());
    KVS_RETURN_IF_ERROR(check_send_args(header, body));
    return post_locked(header, body);
  }

  Status wait_sends(uint64_t seq, Deadline deadline, const CancelToken& cancel) override {
    std::lock_guard lock(tx_mu_);
    return wait_locked(seq, deadline, cancel);
  }

  Result<size_t> recv_header(std::vector<std::byte>& header, Deadline deadline, const CancelToken& cancel) override {
    std::lock_guard lock(rx_mu_);
    KVS_RETURN_IF_ERROR(check_usable());
    if (body_pending_ && body_left_ > 0)
      return detail::log_error(make_status(StatusCode::invalid_argument,
                                           "tcp recv from {}: {} body bytes of the previous message were not read "
                                           "(call recv_body, with an empty span to discard)",
                                           peer_, body_left_));
    body_pending_ = false;
    // Prefix and header accumulate in rx_buf_, so a deadline or cancel here loses
    // nothing: the next recv_header continues the same message.
    KVS_RETURN_IF_ERROR(fill(kTcpPrefixBytes, deadline, cancel));
    const TcpPrefix p = decode_prefix(rx_buf_.data() + rx_begin_);
    if (p.magic != kTcpMagic)
      return fail(make_status(StatusCode::corrupt_data, "tcp recv from {}: bad frame magic {:#010x} (want {:#010x})",
                              peer_, p.magic, kTcpMagic));
    if (p.header_len > kMaxHeaderBytes)
      return fail(make_status(StatusCode::corrupt_data, "tcp recv from {}: header length {} exceeds {}", peer_,
                              p.header_len, kMaxHeaderBytes));
    if (p.body_len > kTcpMaxBodyBytes)
      return fail(make_status(StatusCode::corrupt_data, "tcp recv from {}: body length {} exceeds {}", peer_,
                              p.body_len, kTcpMaxBodyBytes));
    KVS_RETURN_IF_ERROR(fill(kTcpPrefixBytes + p.header_len, deadline, cancel));
    const std::byte* h = rx_buf_.data() + rx_begin_ + kTcpPrefixBytes;
    header.assign(h, h + p.header_len);
    rx_begin_ += kTcpPrefixBytes + p.header_len;
    body_pending_ = true;
    body_left_ = p.body_len;
    return size_t(p.body_len);
  }

  Status recv_body(std::span<std::byte> dest, Deadline deadline, const CancelToken& cancel) override {
    std::lock_guard lock(rx_mu_);
    KVS_RETURN_IF_ERROR(check_usable());
    if (!body_pending_)
      return detail::log_error(
          make_status(StatusCode::invalid_argument, "tcp recv_body from {}: no message header was received", peer_));
    if (!dest.empty() && dest.size() < body_left_)
      return detail::log_error(make_status(StatusCode::invalid_argument,
                                           "tcp recv_body from {}: destination of {} bytes is smaller than the {} "
                                           "byte body",
                                           peer_, dest.size(), body_left_));
    if (!dest.empty() && dest.data() == nullptr)
      return detail::log_error(make_status(StatusCode::invalid_argument, "tcp recv_body from {}: null destination", peer_));
    if (body_left_ == 0) {
      body_pending_ = false;
      return {};
    }
    KVS_RETURN_IF_ERROR(check_wait(deadline, cancel, "recv_body"));
    const bool discard = dest.empty();
    const uint64_t total = body_left_;
    uint64_t off = 0;
    // Body bytes that came in with the header (bounded by kTcpRxBufferBytes).
    const size_t buffered = std::min<uint64_t>(rx_end_ - rx_begin_, body_left_);
    if (buffered > 0) {
      if (!discard) std::memcpy(dest.data(), rx_buf_.data() + rx_begin_, buffered);
      rx_begin_ += buffered;
      off += buffered;
    }
    if (rx_begin_ == rx_end_) rx_begin_ = rx_end_ = 0;
    // The rest goes straight into dest (or through rx_buf_ when discarding).
    while (off < total) {
      std::byte* to = discard ? rx_buf_.data() : dest.data() + off;
      const uint64_t want = discard ? std::min<uint64_t>(total - off, rx_buf_.size())
                                    : std::min<uint64_t>(total - off, uint64_t(1) << 30);
      io_uring_sqe* s = rx_.sqe();
      const uint64_t id = rx_.next_id();
      io_uring_prep_recv(s, fd_, to, size_t(want), MSG_WAITALL);
      io_uring_sqe_set_data64(s, id);
      int res = 0;
      bool got = false;
      Status st = await_op(rx_, fd_, id, deadline, cancel, res, got);
      if (!st.ok())
        return fail(st.with_context(
            fmt::format("tcp recv_body from {} ({} of {} body bytes received)", peer_, off, total)));
      if (res == 0)
        return fail(make_status(StatusCode::unavailable,
                                "tcp recv_body: peer {} closed the connection after {} of {} body bytes", peer_, off,
                                total));
      if (res < 0) return fail(make_status(code_for_errno(-res), "tcp recv_body from {}: {}", peer_, errno_text(-res)));
      off += uint64_t(res);
    }
    body_left_ = 0;
    body_pending_ = false;
    return {};
  }

  [[nodiscard]] std::string peer_address() const override { return peer_; }
  [[nodiscard]] std::string describe() const override {
    return fmt::format("tcp {} (io_uring{})", peer_, opt_.send_zc ? ", send_zc" : "");
  }

 private:
  /// unavailable once the connection was closed by an earlier error.
  Status check_usable() {
    if (!broken_.load(std::memory_order_acquire)) return {};
    std::lock_guard lock(broken_mu_);
    return make_status(StatusCode::unavailable, "tcp connection to {} is closed after an earlier error: {}", peer_,
                       broken_why_);
  }

  Status check_wait(Deadline deadline, const CancelToken& cancel, std::string_view what) const {
    if (cancel.cancelled()) return make_status(StatusCode::cancelled, "tcp {} to {}: cancelled", what, peer_);
    if (Clock::now() >= deadline) return make_status(StatusCode::timed_out, "tcp {} to {}: deadline passed", what, peer_);
    return {};
  }

  Status check_send_args(std::span<const std::byte> header, std::span<const std::byte> body) const {
    if (header.size() > kMaxHeaderBytes)
      return detail::log_error(make_status(StatusCode::invalid_argument, "tcp send to {}: header of {} bytes exceeds {}",
                                           peer_, header.size(), kMaxHeaderBytes));
    if (body.size() > kTcpMaxBodyBytes)
      return detail::log_error(make_status(StatusCode::invalid_argument, "tcp send to {}: body of {} bytes exceeds {}",
                                           peer_, body.size(), kTcpMaxBodyBytes));
    if (!body.empty() && body.data() == nullptr)
      return detail::log_error(make_status(StatusCode::invalid_argument, "tcp send to {}: null body", peer_));
    return {};
  }

  // ---- the send pipeline (all under tx_mu_) ----
  //
  // Posted messages wait in txq_, in order. At most one chain of linked SENDMSGs
  // (IOSQE_IO_LINK, one SQE per message gathering prefix + header + body) is in the
  // kernel at a time: a chain keeps its messages in order on the stream, and two
  // chains could interleave, so the next chain (everything posted meanwhile) goes
  // in when the current one has reported. With MSG_WAITALL a send is short only
  // when the socket failed; a short send fails the chain (the kernel completes the
  // later links with -ECANCELED, having sent none of their bytes), and the next
  // chain starts with the remainder of the short one, so the order holds.

  /// Queues one message (arguments already checked) and starts it when no chain is busy.
  Result<uint64_t> post_locked(std::span<const std::byte> header, std::span<const std::byte> body) {
    std::unique_ptr<TxMsg> m;
    if (!tx_pool_.empty()) {
      m = std::move(tx_pool_.back());
      tx_pool_.pop_back();
    } else {
      m = std::make_unique<TxMsg>();
    }
    encode_prefix(m->head.data(), uint32_t(header.size()), body.size());
    if (!header.empty()) std::memcpy(m->head.data() + kTcpPrefixBytes, header.data(), header.size());
    m->iov[0] = {m->head.data(), kTcpPrefixBytes + header.size()};
    m->iov_count = 1;
    if (!body.empty()) m->iov[m->iov_count++] = {const_cast<std::byte*>(body.data()), body.size()};
    m->first = 0;
    m->total = m->left = kTcpPrefixBytes + header.size() + body.size();
    m->op = 0;
    m->notifs = 0;
    m->zc = opt_.send_zc && body.size() >= opt_.send_zc_min_bytes;
    m->seq = ++tx_posted_;
    const uint64_t seq = m->seq;
    txq_.push_back(std::move(m));
    if (Status st = tx_pump(); !st.ok()) return tx_abort_and_fail(std::move(st));
    return seq;
  }

  /// Waits until every message up to `seq` is handed to the socket.
  Status wait_locked(uint64_t seq, Deadline deadline, const CancelToken& cancel) {
    if (seq > tx_posted_)
      return detail::log_error(make_status(StatusCode::invalid_argument,
                                           "tcp wait_sends to {}: sequence {} was never posted (last is {})", peer_,
                                           seq, tx_posted_));
    if (seq <= tx_done_) return {};
    if (Status st = check_usable(); !st.ok()) {
      tx_abort();  // broken from the receive side: reap what is still in the kernel
      return st;
    }
    for (;;) {
      if (Status st = tx_pump(); !st.ok()) return tx_abort_and_fail(std::move(st));
      if (tx_done_ >= seq) return {};
      Status why;
      if (cancel.cancelled()) {
        why = Status(StatusCode::cancelled, "cancelled");
      } else if (Clock::now() >= deadline) {
        why = Status(StatusCode::timed_out, "deadline passed");
      }
      if (!why.ok()) return tx_abort_and_fail(std::move(why));
      // Sleep until at least the completions that `seq` still needs could be there.
      unsigned need = 0;
      for (const auto& m : txq_) {
        if (m->seq > seq) break;
        need += (m->op != 0 ? 1u : 0u) + unsigned(m->notifs);
      }
      const auto slice = std::min<Clock::duration>(deadline - Clock::now(), kTcpWaitSlice);
      const auto ns = std::max<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count(), 1000);
      __kernel_timespec ts{};
      ts.tv_sec = ns / 1000000000;
      ts.tv_nsec = ns % 1000000000;
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_submit_and_wait_timeout(tx_.get(), &cqe, std::max(need, 1u), &ts, nullptr);
      if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
        return tx_abort_and_fail(make_status(StatusCode::io_error, "io_uring wait failed: {}", errno_text(-rc)));
    }
  }

  /// Reaps the completions that are there, retires finished messages and submits
  /// the next chain when none is in flight. Returns the first send error.
  Status tx_pump() {
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(tx_.get(), &cqe) == 0 && cqe) {
      const Completion c{cqe->user_data, cqe->res, cqe->flags};
      io_uring_cqe_seen(tx_.get(), cqe);
      tx_complete(c);
    }
    if (!tx_err_.ok()) return tx_err_;
    while (!txq_.empty()) {
      TxMsg& m = *txq_.front();
      if (m.left > 0 || m.op != 0 || m.notifs > 0) break;
      tx_done_ = m.seq;
      tx_pool_.push_back(std::move(txq_.front()));
      txq_.pop_front();
    }
    if (tx_ops_ == 0) return tx_submit_chain();
    return {};
  }

  /// Accounts one completion of the send ring.
  void tx_complete(const Completion& c) {
    if (c.flags & IORING_CQE_F_NOTIF) {
      for (size_t i = 0; i < tx_notif_.size(); ++i) {
        if (tx_notif_[i].first != c.user_data) continue;
        --tx_notif_[i].second->notifs;
        tx_notif_[i] = tx_notif_.back();
        tx_notif_.pop_back();
        break;
      }
      return;
    }
    TxMsg* m = nullptr;
    for (const auto& q : txq_) {
      if (q->op == c.user_data) {
        m = q.get();
        break;
      }
    }
    if (m == nullptr) return;  // a cancel request's own completion
    m->op = 0;
    --tx_ops_;
    if (c.flags & IORING_CQE_F_MORE) {
      ++m->notifs;
      tx_notif_.emplace_back(c.user_data, m);
    }
    if (!tx_err_.ok() || tx_aborting_) return;  // only reaping now
    if (c.res == -ECANCELED) {
      tx_chain_cancelled_ = true;  // a link after a short send: none of it was sent
    } else if (c.res < 0) {
      tx_err_ = make_status(code_for_errno(-c.res), "tcp send to {}: {}", peer_, errno_text(-c.res));
    } else if (c.res == 0) {
      tx_err_ = make_status(StatusCode::unavailable, "tcp send to {}: connection closed", peer_);
    } else {
      size_t done = std::min<uint64_t>(uint64_t(c.res), m->left);
      m->left -= done;
      while (done > 0 && m->first < m->iov_count) {
        iovec& v = m->iov[m->first];
        const size_t take = std::min(done, v.iov_len);
        v.iov_base = static_cast<std::byte*>(v.iov_base) + take;
        v.iov_len -= take;
        done -= take;
        if (v.iov_len == 0) ++m->first;
      }
      if (m->left > 0) tx_chain_short_ = true;
    }
    if (tx_ops_ == 0 && tx_err_.ok() && tx_chain_cancelled_ && !tx_chain_short_)
      tx_err_ = make_status(StatusCode::io_error, "tcp send to {}: the kernel cancelled a send", peer_);
  }

  /// Submits the unsent messages (from the first one with bytes left) as one chain.
  Status tx_submit_chain() {
    auto it = std::find_if(txq_.begin(), txq_.end(), [](const auto& m) { return m->left > 0; });
    if (it == txq_.end()) return {};
    const size_t room = std::min<size_t>(io_uring_sq_space_left(tx_.get()), size_t(txq_.end() - it));
    if (room == 0) return make_status(StatusCode::io_error, "tcp send to {}: no free submission entry", peer_);
    tx_chain_short_ = tx_chain_cancelled_ = false;
    for (size_t i = 0; i < room; ++i, ++it) {
      TxMsg& m = **it;
      m.msg = msghdr{};
      m.msg.msg_iov = m.iov + m.first;
      m.msg.msg_iovlen = size_t(m.iov_count - m.first);
      io_uring_sqe* s = io_uring_get_sqe(tx_.get());
      if (m.zc)
        io_uring_prep_sendmsg_zc(s, fd_, &m.msg, MSG_NOSIGNAL | MSG_WAITALL);
      else
        io_uring_prep_sendmsg(s, fd_, &m.msg, MSG_NOSIGNAL | MSG_WAITALL);
      if (i + 1 < room) s->flags |= IOSQE_IO_LINK;
      m.op = tx_.next_id();
      io_uring_sqe_set_data64(s, m.op);
      ++tx_ops_;
    }
    const int rc = io_uring_submit(tx_.get());
    if (rc < 0) return make_status(StatusCode::io_error, "tcp send to {}: io_uring submit failed: {}", peer_, errno_text(-rc));
    return {};
  }

  /// Cancels what the kernel still holds of posted messages, reaps it (so nothing
  /// reads caller memory afterwards) and drops every unfinished message. When the
  /// kernel does not let go within a second, the socket is shut down.
  void tx_abort() {
    tx_aborting_ = true;
    const CancelToken never;
    const auto t0 = Clock::now();
    auto next_cancel = t0;
    bool shut = false;
    while (tx_ops_ > 0 || !tx_notif_.empty()) {
      const auto now = Clock::now();
      if (tx_ops_ > 0 && now >= next_cancel) {
        // Repeated: a link not yet started when a cancel went in starts later.
        for (const auto& m : txq_) {
          if (m->op == 0) continue;
          if (io_uring_sqe* s = tx_.sqe()) {
            io_uring_prep_cancel64(s, m->op, 0);
            io_uring_sqe_set_data64(s, tx_.next_id());
          }
        }
        next_cancel = now + std::chrono::milliseconds(100);
      }
      if (!shut && now - t0 >= std::chrono::seconds(1)) {
        shutdown(fd_, SHUT_RDWR);
        shut = true;
      }
      Completion c;
      Status w = next_completion(tx_, c, std::min(next_cancel, now + std::chrono::milliseconds(100)), &never);
      if (w.code() == StatusCode::timed_out) {
        if (shut && now - t0 >= std::chrono::seconds(6)) {
          KVS_LOG_WARN("tcp: still waiting for the kernel to release sends on fd {}", fd_);
        }
        continue;
      }
      if (!w.ok()) {
        // The ring failed: the kernel may still read these buffers; never free them.
        KVS_LOG_ERROR("tcp: send ring of fd {} failed while aborting sends: {}", fd_, w.to_string());
        shutdown(fd_, SHUT_RDWR);
        for (auto& m : txq_) (void)m.release();
        txq_.clear();
        tx_notif_.clear();
        tx_ops_ = 0;
        break;
      }
      tx_complete(c);
    }
    for (auto& m : txq_) tx_pool_.push_back(std::move(m));
    txq_.clear();
    tx_aborting_ = false;
  }

  Status tx_abort_and_fail(Status why) {
    const size_t unsent = txq_.size();
    tx_abort();
    return fail(why.with_context(fmt::format("tcp send to {} ({} posted message(s) not handed over)", peer_, unsent)));
  }

  /// Marks the connection broken, shuts the socket down (the peer sees the close,
  /// the other direction's call ends) and returns `why` (logged unless it is a
  /// deadline or cancel, which the caller asked for).
  Status fail(Status why) {
    {
      std::lock_guard lock(broken_mu_);
      if (!broken_.load(std::memory_order_relaxed)) broken_why_ = why.to_string();
      broken_.store(true, std::memory_order_release);
    }
    shutdown(fd_, SHUT_RDWR);
    if (why.code() == StatusCode::timed_out || why.code() == StatusCode::cancelled) {
      KVS_LOG_DEBUG("{}", why.to_string());
      return why;
    }
    return detail::log_error(std::move(why));
  }

  /// Reads until rx_buf_ holds at least `need` unread bytes (need <= buffer size).
  Status fill(size_t need, Deadline deadline, const CancelToken& cancel) {
    while (rx_end_ - rx_begin_ < need) {
      if (rx_buf_.size() - rx_begin_ < need) {  // not enough room behind: compact
        std::memmove(rx_buf_.data(), rx_buf_.data() + rx_begin_, rx_end_ - rx_begin_);
        rx_end_ -= rx_begin_;
        rx_begin_ = 0;
      }
      KVS_RETURN_IF_ERROR(check_wait(deadline, cancel, "recv_header"));
      io_uring_sqe* s = rx_.sqe();
      const uint64_t id = rx_.next_id();
      io_uring_prep_recv(s, fd_, rx_buf_.data() + rx_end_, rx_buf_.size() - rx_end_, 0);
      io_uring_sqe_set_data64(s, id);
      int res = 0;
      bool got = false;
      Status st = await_op(rx_, fd_, id, deadline, cancel, res, got);
      if (got && res > 0) rx_end_ += size_t(res);  // kept even when the wait ended first
      if (!st.ok()) {
        if (st.code() == StatusCode::timed_out || st.code() == StatusCode::cancelled) {
          const Status out = st.with_context(fmt::format("tcp recv_header from {}", peer_));
          KVS_LOG_DEBUG("{}", out.to_string());
          return out;
        }
        return fail(st.with_context(fmt::format("tcp recv_header from {}", peer_)));
      }
      if (res == 0) {
        const size_t partial = rx_end_ - rx_begin_;
        if (partial == 0)
          return fail(make_status(StatusCode::unavailable, "tcp recv from {}: peer closed the connection", peer_));
        return fail(make_status(StatusCode::unavailable,
                                "tcp recv from {}: peer closed the connection in the middle of a message ({} bytes "
                                "of its prefix/header received)",
                                peer_, partial));
      }
      if (res < 0) return fail(make_status(code_for_errno(-res), "tcp recv from {}: {}", peer_, errno_text(-res)));
    }
    return {};
  }

  const int fd_;
  const std::string peer_;
  const TcpSettings opt_;

  std::atomic<bool> broken_{false};
  std::mutex broken_mu_;
  std::string broken_why_;

  /// One posted message: its prefix and header (copied), where its bytes are and
  /// what of it the kernel still holds.
  struct TxMsg {
    uint64_t seq = 0;
    std::array<std::byte, kTcpPrefixBytes + kMaxHeaderBytes> head{};
    iovec iov[2]{};
    int iov_count = 0, first = 0;
    msghdr msg{};
    uint64_t total = 0, left = 0;
    uint64_t op = 0;  ///< id of its SENDMSG in the kernel, 0 when none
    int notifs = 0;   ///< zero-copy notifications still to come
    bool zc = false;
  };

  std::mutex tx_mu_;
  Ring tx_;
  std::deque<std::unique_ptr<TxMsg>> txq_;  ///< posted and not yet handed over, in order
  std::vector<std::unique_ptr<TxMsg>> tx_pool_;
  std::vector<std::pair<uint64_t, TxMsg*>> tx_notif_;  ///< zero-copy notifications awaited
  size_t tx_ops_ = 0;                                   ///< SENDMSGs of the chain in flight
  bool tx_chain_short_ = false, tx_chain_cancelled_ = false, tx_aborting_ = false;
  uint64_t tx_posted_ = 0, tx_done_ = 0;
  Status tx_err_;

  std::mutex rx_mu_;
  Ring rx_;
  std::vector<std::byte> rx_buf_;
  size_t rx_begin_ = 0, rx_end_ = 0;
  bool body_pending_ = false;
  uint64_t body_left_ = 0;
};

// ---- listener -------------------------------------------------------------------------

class TcpListener final : public Listener {
 public:
  TcpListener(int fd, std::string address, const TcpSettings& opt, unsigned depth)
      : fd_(fd), address_(std::move(address)), opt_(opt), depth_(depth) {}
  ~TcpListener() override {
    if (pending_fd_ >= 0) close(pending_fd_);
    close(fd_);
  }

  Status init() { return ring_.init(4); }

  Result<std::unique_ptr<Connection>> accept(Deadline deadline, const CancelToken& cancel) override {
    std::lock_guard lock(mu_);
    int cfd = -1;
    sockaddr_storage peer{};
    if (pending_fd_ >= 0) {  // accepted by an earlier call just as its wait ended
      cfd = pending_fd_;
      peer = pending_peer_;
      pending_fd_ = -1;
    } else {
      if (cancel.cancelled()) return make_status(StatusCode::cancelled, "tcp accept on {}: cancelled", address_);
      socklen_t len = sizeof peer;
      io_uring_sqe* s = ring_.sqe();
      const uint64_t id = ring_.next_id();
      io_uring_prep_accept(s, fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
      io_uring_sqe_set_data64(s, id);
      int res = 0;
      bool got = false;
      Status st = await_op(ring_, fd_, id, deadline, cancel, res, got);
      if (!st.ok()) {
        if (got && res >= 0) {  // a connection arrived as we gave up: keep it for the next call
          pending_fd_ = res;
          pending_peer_ = peer;
        }
        return st.with_context(fmt::format("tcp accept on {}", address_));
      }
      if (res < 0)
        return detail::log_error(
            make_status(code_for_errno(-res), "tcp accept on {}: {}", address_, errno_text(-res)));
      cfd = res;
    }
    configure_socket(cfd, opt_);
    auto conn = std::make_unique<TcpConnection>(cfd, format_address(reinterpret_cast<sockaddr*>(&peer)), opt_);
    if (Status st = conn->init(depth_); !st.ok()) return detail::log_error(st);
    return std::unique_ptr<Connection>(std::move(conn));
  }

  [[nodiscard]] std::string address() const override { return address_; }

 private:
  const int fd_;
  const std::string address_;
  const TcpSettings opt_;
  const unsigned depth_;
  std::mutex mu_;
  Ring ring_;
  int pending_fd_ = -1;
  sockaddr_storage pending_peer_{};
};

// ---- backend --------------------------------------------------------------------------

class TcpBackend final : public Backend {
 public:
  TcpBackend(const BackendConfig& config, const TcpSettings& opt) : opt_(opt), depth_(config.tcp.queue_depth) {
    caps_.backend = "tcp";
    caps_.provider = "io_uring";
    caps_.host_memory = true;
    caps_.cuda_memory = false;
    caps_.one_sided_read = false;
    caps_.notifications = false;
    caps_.max_message_bytes = kTcpMaxBodyBytes;
  }

  [[nodiscard]] const Capabilities& capabilities() const override { return caps_; }

  Result<std::unique_ptr<Listener>> listen(const std::string& address) override {
    auto resolved = resolve_address("tcp", address, true);
    if (!resolved.ok()) return detail::log_error(resolved.status());
    const std::vector<sockaddr_storage>& addrs = *resolved;
    Status last;
    for (const sockaddr_storage& a : addrs) {
      const int fd = socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        last = make_status(StatusCode::io_error, "tcp listen on {}: socket: {}", address, errno_text(errno));
        continue;
      }
      const int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      configure_socket(fd, opt_);  // accepted sockets inherit the buffer sizes
      if (bind(fd, reinterpret_cast<const sockaddr*>(&a), sockaddr_len(a)) != 0 || ::listen(fd, 512) != 0) {
        const int err = errno;
        last = make_status(err == EADDRINUSE || err == EACCES || err == EADDRNOTAVAIL ? StatusCode::unavailable
                                                                                        : StatusCode::io_error,
                           "tcp listen on {}: {}", address, errno_text(err));
        close(fd);
        continue;
      }
      sockaddr_storage bound{};
      socklen_t len = sizeof bound;
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      auto l = std::make_unique<TcpListener>(fd, format_address(reinterpret_cast<sockaddr*>(&bound)), opt_, depth_);
      if (Status st = l->init(); !st.ok()) return detail::log_error(st);
      KVS_LOG_DEBUG("tcp: listening on {}", l->address());
      return std::unique_ptr<Listener>(std::move(l));
    }
    return detail::log_error(last);
  }

  Result<std::unique_ptr<Connection>> connect(const std::string& address, Deadline deadline,
                                              const CancelToken& cancel) override {
    auto resolved = resolve_address("tcp", address, false);
    if (!resolved.ok()) return detail::log_error(resolved.status());
    const std::vector<sockaddr_storage>& addrs = *resolved;
    Status last;
    for (const sockaddr_storage& a : addrs) {
      const int fd = socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        last = make_status(StatusCode::io_error, "tcp connect to {}: socket: {}", address, errno_text(errno));
        continue;
      }
      configure_socket(fd, opt_);
      auto conn = std::make_unique<TcpConnection>(fd, format_address(reinterpret_cast<const sockaddr*>(&a)), opt_);
      if (Status st = conn->init(depth_); !st.ok()) return detail::log_error(st);
      last = conn->connect_to(a, deadline, cancel);
      if (last.ok()) return std::unique_ptr<Connection>(std::move(conn));
      if (last.code() == StatusCode::timed_out || last.code() == StatusCode::cancelled) break;
    }
    return detail::log_error(last);
  }

  Result<MemoryRegion> register_memory(void* data, size_t size, MemoryType type) override {
    if (type != MemoryType::host)
      return detail::log_error(make_status(StatusCode::unsupported,
                                           "tcp backend registers host memory only, not {} memory",
                                           memory_type_name(type)));
    if (data == nullptr || size == 0)
      return detail::log_error(make_status(StatusCode::invalid_argument,
                                           "tcp register_memory: empty range (data {}, size {})", data, size));
    if (auto hit = cache_.find(data, size, type)) return RegionAccess::wrap(hit);
    auto region = std::make_shared<TcpRegion>();
    region->data = static_cast<std::byte*>(data);
    region->size = size;
    region->type = type;
    cache_.insert(region);
    return RegionAccess::wrap(std::move(region));
  }

 private:
  Capabilities caps_;
  TcpSettings opt_;
  unsigned depth_;
  RegistrationCache cache_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_backend(const BackendConfig& config) {
  if (config.memory != MemoryType::host)
    return make_status(StatusCode::unsupported,
                       "tcp backend moves host memory only: {} memory needs a GPUDirect-capable backend (ucx)",
                       memory_type_name(config.memory));
  if (config.tcp.queue_depth < 4 || config.tcp.queue_depth > 32768)
    return make_status(StatusCode::invalid_argument, "tcp.queue_depth {} is outside [4, 32768]",
                       config.tcp.queue_depth);
  TcpSettings opt = config.tcp;
  {
    // Probe io_uring once (it may be disabled by sysctl or seccomp) and the opcodes used.
    Ring probe_ring;
    KVS_RETURN_IF_ERROR(probe_ring.init(4));
    io_uring_probe* probe = io_uring_get_probe_ring(probe_ring.get());
    if (!probe) return make_status(StatusCode::unavailable, "tcp: io_uring opcode probe failed");
    const bool basic = io_uring_opcode_supported(probe, IORING_OP_SENDMSG) &&
                       io_uring_opcode_supported(probe, IORING_OP_RECV) &&
                       io_uring_opcode_supported(probe, IORING_OP_ACCEPT) &&
                       io_uring_opcode_supported(probe, IORING_OP_CONNECT) &&
                       io_uring_opcode_supported(probe, IORING_OP_ASYNC_CANCEL);
    const bool zc = io_uring_opcode_supported(probe, IORING_OP_SENDMSG_ZC);
    io_uring_free_probe(probe);
    if (!basic) return make_status(StatusCode::unavailable, "tcp: this kernel's io_uring lacks socket opcodes");
    if (opt.send_zc && !zc) {
      KVS_LOG_WARN("tcp: IORING_OP_SENDMSG_ZC is not supported by this kernel; using plain sends");
      opt.send_zc = false;
    }
  }
  return std::unique_ptr<Backend>(std::make_unique<TcpBackend>(config, opt));
}

}  // namespace tcp

Result<std::unique_ptr<Backend>> make_tcp_backend(const BackendConfig& config) {
  return tcp::make_backend(config);
}

}  // namespace kvstream::transport

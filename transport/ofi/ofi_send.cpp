// A libfabric connection's sending side. post_send copies only the header (injected
// when small) and posts the body segments straight from the caller's registered
// memory; what the provider's queue cannot take yet waits in the backlog, flushed by
// later send calls and by the connection's receive calls. wait_sends polls until the
// messages' operations complete; on timeout, cancel or error it breaks the sending
// side, cancelling and draining what is outstanding.
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>

#include "core/log.hpp"
#include "transport/common/tag_cover.hpp"
#include "transport/ofi/ofi_connection.hpp"

namespace kvstream::transport::ofi {

using namespace std::chrono_literals;

namespace {
/// The connection whose backlog this thread is flushing: a clear routed meanwhile
/// (a poll inside the flush) leaves its body to that flush.
thread_local const OfiConnection* t_flushing = nullptr;
}  // namespace

Result<uint64_t> OfiConnection::post_send(std::span<const std::byte> header, std::span<const std::byte> body) {
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
  // A body past the inject size waits for the receiver's clear (Core::cleared_bodies;
  // the connection's standing clear receive takes it).
  const bool waits = core.cleared_bodies && !body.empty() && !body_inject;

  // Header message: copied (prefix + header), injected when small enough.
  const size_t hlen = sizeof(HeaderPrefix) + header.size();
  HeaderPrefix prefix{kHeaderMagic, uint32_t(header.size()) | (waits ? kWaitsForClear : 0), uint64_t(body.size())};
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
      pieces.push_back({new_send_op(0), body.data() + off, n, bdesc, make_tag(MsgType::body, id_, seq, i), false});
    }
  }
  for (auto& p : pieces) msg.ops.push_back(p.op);
  outstanding_.push_back(std::move(msg));
  {
    std::lock_guard lock(backlog_mu_);
    posted_upto_ = seq + 1;
    backlog_.push_back(std::move(pieces.front()));  // the header
    if (waits) {
      held_.push_back({seq, {std::make_move_iterator(pieces.begin() + 1), std::make_move_iterator(pieces.end())}});
    } else {
      for (size_t i = 1; i < pieces.size(); ++i) backlog_.push_back(std::move(pieces[i]));
    }
  }
  ++send_seq_;  // the message is committed: it goes out whole, or the connection breaks
  if (Status st = flush(); !st.ok()) {
    abort_sends();
    return st;
  }
  return seq + 1;
}

Status OfiConnection::wait_sends(uint64_t seq, Deadline deadline, const CancelToken& cancel) {
  if (seq > send_seq_)
    return make_status(StatusCode::invalid_argument, "libfabric: wait_sends({}) but only {} messages posted", seq,
                       send_seq_);
  auto failed = [&]() -> Status {
    abort_sends();
    return peer_fault(side_, StatusCode::unavailable, "libfabric: send to {} failed: {}", peer_name_,
                      fi_err(shared_->send_error.load()));
  };
  if (shared_->send_error.load()) return failed();
  Status flushed;
  auto st = wait_on_peer(
      [&] {
        if (flushed.ok()) flushed = flush();
        reap();
        return !flushed.ok() || shared_->send_error.load() != 0 || outstanding_.empty() ||
               outstanding_.front().seq > seq;
      },
      deadline, cancel, "wait_sends");
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

Status OfiConnection::send_usable() const {
  if (peer_lost_.load()) return peer_lost_status();  // said where it was found; its abort set send_error
  if (int e = shared_->send_error.load())
    return peer_fault(side_, StatusCode::unavailable, "libfabric: connection to {} is broken: {}", peer_name_,
                      fi_err(e));
  if (shared_->bye.load())
    return peer_fault(side_, StatusCode::unavailable, "libfabric: peer {} closed the connection", peer_name_);
  return {};
}

std::shared_ptr<Op> OfiConnection::new_send_op(size_t buf_size) {
  auto op = ep_->new_op(buf_size);
  auto sh = shared_;
  op->on_complete = [sh, side = side_](Op& o) {
    if (o.err) {
      int expected = 0;
      sh->send_error.compare_exchange_strong(expected, o.err);
      if (o.err != FI_ECANCELED)
        detail::logger().log(peer_fault_level(side), "libfabric: send failed: {}", fi_err(o.err));
    }
  };
  return op;
}

Status OfiConnection::flush() {
  // Again while clears arrived meanwhile: one that came while this thread held the
  // lock could not send its body itself.
  for (;;) {
    const uint64_t seen = clears_arrived_.load(std::memory_order_acquire);
    Status st;
    {
      std::lock_guard lock(backlog_mu_);
      t_flushing = this;
      st = flush_locked();
      t_flushing = nullptr;
    }
    if (!st.ok() || clears_arrived_.load(std::memory_order_acquire) == seen) return st;
  }
}

void OfiConnection::release_cleared_locked() {
  {
    std::lock_guard lock(clears_mu_);
    cleared_ready_.insert(clears_in_.begin(), clears_in_.end());
    clears_in_.clear();
  }
  // Clears carry the sequence as the tag does (its low 24 bits).
  while (!held_.empty() && cleared_ready_.erase(held_.front().seq & Tag::kSeqMask) > 0) {
    for (auto& p : held_.front().pieces) backlog_.push_back(std::move(p));
    held_.pop_front();
  }
  // A clear may come before its message is posted (a receive posted ahead clears at
  // once). Those behind the first message not yet sent (answered, released with no
  // body, or junk) and those further ahead than a window are forgotten, so that they
  // cannot pile up.
  const uint64_t next = (held_.empty() ? posted_upto_ : held_.front().seq) & Tag::kSeqMask;
  std::erase_if(cleared_ready_, [&](uint64_t c) { return ((c - next) & Tag::kSeqMask) >= kMaxLead; });
}

void OfiConnection::on_clear(const Op& o) {
  if (o.err) return;  // cancelled: the connection is closing
  {
    std::lock_guard lock(clears_mu_);
    clears_in_.push_back(Tag::unpack(o.tag).seq);
  }
  clears_arrived_.fetch_add(1, std::memory_order_acq_rel);
  if (Status st = post_clear_recv(); !st.ok()) {
    int expected = 0;
    shared_->send_error.compare_exchange_strong(expected, FI_EIO);
    KVS_LOG_WARN("libfabric: connection to {} cannot take clears any more: {}", peer_name_, st.to_string());
    return;
  }
  // Sends the body now, unless this thread is inside this connection's flush (it sees
  // the clear when it looks again) or another thread is (flush looks again too).
  if (t_flushing == this) return;
  std::unique_lock lock(backlog_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  for (;;) {
    const uint64_t seen = clears_arrived_.load(std::memory_order_acquire);
    if (shared_->send_error.load() != 0) return;
    t_flushing = this;
    (void)flush_locked();
    t_flushing = nullptr;
    if (clears_arrived_.load(std::memory_order_acquire) == seen) return;
  }
}

Status OfiConnection::post_clear_recv() {
  auto op = ep_->new_op(sizeof(uint64_t));
  op->on_complete = [sh = shared_](Op& o) {
    std::lock_guard lock(sh->conn_mu);
    if (sh->conn) sh->conn->on_clear(o);
  };
  KVS_ASSIGN_OR_RETURN(void* desc, ep_->local_desc(*op));
  constexpr uint64_t kAnySeq = (Tag::kSeqMask << Tag::kSeqShift) | Tag::kSegMask;
  KVS_RETURN_IF_ERROR(ep_->post_recv(op, op->buf.get(), sizeof(uint64_t), desc, make_tag(MsgType::clear, id_), kAnySeq,
                                     deadline_in(1s), recv_from()));
  std::lock_guard lock(clears_mu_);
  clear_op_ = std::move(op);
  return {};
}

Status OfiConnection::flush_locked() {
  release_cleared_locked();
  while (!backlog_.empty()) {
    Piece& p = backlog_.front();
    const ssize_t r = p.inject ? ep_->try_inject(p.buf, p.len, peer_.addr(), p.tag)
                               : ep_->try_send(p.op, p.buf, p.len, p.desc, peer_.addr(), p.tag);
    if (r == -FI_EAGAIN) {
      ep_->poll();  // completions free queue entries
      return {};
    }
    if (r != 0) {
      int expected = 0;
      shared_->send_error.compare_exchange_strong(expected, int(-r));
      return peer_fault(side_, StatusCode::unavailable, "libfabric: send to {} failed: {}", peer_name_,
                        fi_err(int(r)));
    }
    if (p.inject) p.op->done.store(true, std::memory_order_release);
    backlog_.pop_front();
  }
  return {};
}

void OfiConnection::progress_sends() {
  // A broken sending side is the sender's to abort (its next call does); a sender
  // inside flush right now is progressing its pieces itself.
  if (shared_->send_error.load() != 0) return;
  std::unique_lock lock(backlog_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  t_flushing = this;
  (void)flush_locked();  // an error lands in send_error: the sender's next call reports it
  t_flushing = nullptr;
}

void OfiConnection::reap() {
  while (!outstanding_.empty()) {
    for (auto& op : outstanding_.front().ops)
      if (!op->done.load(std::memory_order_acquire)) return;
    outstanding_.pop_front();
  }
}

void OfiConnection::abort_sends() {
  int expected = 0;
  shared_->send_error.compare_exchange_strong(expected, FI_ECANCELED);
  {
    std::lock_guard lock(backlog_mu_);
    for (auto& p : backlog_) {
      p.op->err = FI_ECANCELED;
      p.op->done.store(true, std::memory_order_release);
    }
    backlog_.clear();
    // Bodies still waiting for their clear were never handed to the provider: they
    // end here (their clears' receives are cancelled below).
    for (auto& h : held_)
      for (auto& p : h.pieces) {
        p.op->err = FI_ECANCELED;
        p.op->done.store(true, std::memory_order_release);
      }
    held_.clear();
  }
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
  // ofi_rxm cannot cancel a send. To a peer found gone that is expected (a rendezvous
  // send waits for the read of a peer that died); to a live one it is worth an error
  // line.
  if (!ep_->wait(all_done, deadline_in(200ms), nullptr, "cancel sends").ok())
    detail::logger().log(peer_lost_.load() ? spdlog::level::debug : spdlog::level::err,
                         "libfabric: a send from a caller's buffer to {} could not be cancelled", peer_name_);
  outstanding_.clear();
}

}  // namespace kvstream::transport::ofi

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
#include "transport/ofi/ofi_connection.hpp"

namespace kvstream::transport::ofi {

using namespace std::chrono_literals;

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
      pieces.push_back({new_send_op(0), body.data() + off, n, bdesc, make_tag(MsgType::body, id_, seq, i), false});
    }
  }
  for (auto& p : pieces) msg.ops.push_back(p.op);
  outstanding_.push_back(std::move(msg));
  {
    std::lock_guard lock(backlog_mu_);
    for (auto& p : pieces) backlog_.push_back(std::move(p));
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
  std::lock_guard lock(backlog_mu_);
  return flush_locked();
}

Status OfiConnection::flush_locked() {
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
  if (lock.owns_lock()) (void)flush_locked();  // an error lands in send_error: the sender's next call reports it
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

// A libfabric connection's receiving side: a header message received into a buffer
// of ours (kept posted across a timeout, so no message is lost and nothing lands in
// the caller's memory later), then the body's segments straight into the caller's
// registered buffer. While they wait, receive calls also flush what the provider
// pushed back of this connection's sends (progress_sends), so a thread that posts and
// then waits for the peer's answer does not stall its own message.
#include <algorithm>
#include <cstring>

#include "core/log.hpp"
#include "transport/common/peer_closed.hpp"
#include "transport/ofi/ofi_connection.hpp"

namespace kvstream::transport::ofi {

using namespace std::chrono_literals;

Result<size_t> OfiConnection::recv_header(std::vector<std::byte>& header, Deadline deadline,
                                          const CancelToken& cancel) {
  if (peer_lost_.load()) return peer_lost_status();
  if (!broken_.empty()) return detail::repeated_status(StatusCode::unavailable, "libfabric: {}", broken_);
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
                             make_tag(MsgType::header, id_, recv_seq_), 0, deadline, recv_from());
    if (!st.ok()) {
      hdr_op_.reset();
      return st;
    }
  }
  bool closed = false;
  auto st = wait_on_peer(
      [&] {
        if (hdr_op_->done.load(std::memory_order_acquire)) return true;
        if (shared_->bye.load(std::memory_order_acquire) && shared_->peer_sent.load() <= recv_seq_) closed = true;
        if (!closed) progress_sends();
        return closed;
      },
      deadline, cancel, "recv_header");
  if (!st.ok()) return st;
  if (!hdr_op_->done.load(std::memory_order_acquire))
    return peer_closed(fmt::format("libfabric: peer {} closed the connection", peer_name_));
  auto op = std::move(hdr_op_);
  if (op->err)
    return peer_fault(side_, StatusCode::unavailable, "libfabric: receive from {} failed: {}", peer_name_,
                      fi_err(op->err));
  HeaderPrefix prefix;
  if (op->len < sizeof prefix) return corrupt("short header message");
  std::memcpy(&prefix, op->buf.get(), sizeof prefix);
  const bool waits = (prefix.header_len & kWaitsForClear) != 0;
  prefix.header_len &= ~kWaitsForClear;
  if (prefix.magic != kHeaderMagic || prefix.header_len > kMaxHeaderBytes ||
      op->len != sizeof prefix + prefix.header_len || (waits && prefix.body_size == 0))
    return corrupt("malformed header message");
  header.assign(op->buf.get() + sizeof prefix, op->buf.get() + op->len);
  if (probe_) probe_->heard();
  ++recv_seq_;
  expect_.read_up_to(recv_seq_);
  body_size_ = prefix.body_size;
  body_pending_ = body_size_ > 0;
  body_waits_ = waits;
  // The receive posted ahead for this message, if any; one without a body lets it go.
  current_post_.reset();
  if (!posted_.empty() && posted_.front().seq == recv_seq_ - 1) {
    current_post_ = std::move(posted_.front());
    posted_.pop_front();
    if (!body_pending_) {
      withdraw(*current_post_);
      current_post_.reset();
    }
  }
  return size_t(prefix.body_size);
}

Status OfiConnection::post_recv(std::span<std::byte> dest) {
  if (peer_lost_.load()) return peer_lost_status();
  if (!broken_.empty()) return detail::repeated_status(StatusCode::unavailable, "libfabric: {}", broken_);
  Core& core = ep_->core();
  Posted p;
  p.seq = recv_seq_ + posted_.size();
  p.dest = dest;
  if (!dest.empty()) {
    void* desc = core.desc_for(dest.data(), dest.size());
    if (!desc && core.mr_local)
      return make_status(StatusCode::invalid_argument,
                         "libfabric: posted buffer is not registered with this backend (provider needs FI_MR_LOCAL)");
    // What is queued for it already and no larger than the inject size was sent at
    // once, and is taken; anything larger came before its clear, and is discarded.
    KVS_RETURN_IF_ERROR(post_body_recvs(p.seq, dest.data(), dest.size(), desc, core.inject, deadline_in(5s), p.ops));
    if (core.cleared_bodies) {
      if (Status st = send_clear(p.seq, deadline_in(5s), {}); !st.ok()) {
        withdraw(p);
        return st;
      }
    }
  }
  posted_.push_back(std::move(p));
  return {};
}

Status OfiConnection::post_body_recvs(uint64_t seq, std::byte* base, size_t size, void* desc,
                                      std::optional<size_t> keep, Deadline deadline,
                                      std::vector<std::shared_ptr<Op>>& ops,
                                      const std::shared_ptr<std::byte[]>& scratch) {
  const size_t seg = ep_->core().segment, nseg = (size + seg - 1) / seg;
  for (size_t i = 0; i < nseg; ++i) {
    const size_t off = i * seg, len = std::min(seg, size - off);
    auto op = ep_->new_op();
    if (scratch) op->buf = scratch;  // the operations keep a discard's buffer alive
    Status st = ep_->post_recv(op, base + off, len, desc, make_tag(MsgType::body, id_, seq, i), 0, deadline,
                               recv_from(), keep);
    if (!st.ok()) {
      for (auto& o : ops) ep_->cancel_and_drain(*o);
      ops.clear();
      return st;
    }
    ops.push_back(std::move(op));
  }
  return {};
}

bool OfiConnection::withdraw(Posted& p) {
  bool all = true;
  for (auto& op : p.ops)
    if (!ep_->cancel_and_drain(*op, 1s)) {
      KVS_LOG_ERROR("libfabric: a receive posted ahead into a caller's buffer could not be withdrawn");
      all = false;
    }
  p.ops.clear();
  return all;
}

Status OfiConnection::abandon_posts() {
  if (posted_.empty() && !current_post_) return {};
  bool all = true;
  for (auto& p : posted_) all = withdraw(p) && all;
  if (current_post_) all = withdraw(*current_post_) && all;
  posted_.clear();
  current_post_.reset();
  // Bodies already cleared for may still come; with nothing posted for them they
  // could only be discarded, so the connection's messages are out of step from here.
  if (broken_.empty()) broken_ = "receives posted ahead were abandoned";
  if (!all)
    return make_status(StatusCode::internal,
                       "libfabric: a receive posted ahead from {} could not be withdrawn; its memory may still be "
                       "written until the connection is destroyed",
                       peer_name_);
  return {};
}

Status OfiConnection::recv_posted_body(std::span<std::byte> dest, Deadline deadline, const CancelToken& cancel) {
  Posted& p = *current_post_;
  Core& core = ep_->core();
  const size_t n = body_size_;
  if (n > p.dest.size()) {
    broken_ = fmt::format("a body of {} bytes from {} for a receive posted with {}", n, peer_name_, p.dest.size());
    withdraw(p);
    current_post_.reset();
    return make_status(StatusCode::invalid_argument, "libfabric: {}", broken_);
  }
  const size_t seg = core.segment, nseg = (n + seg - 1) / seg;
  // Receives for segments past the body's last are never matched.
  while (p.ops.size() > nseg) {
    (void)ep_->cancel_and_drain(*p.ops.back(), 1s);
    p.ops.pop_back();
  }
  auto st = wait_body(p.ops, deadline, cancel);
  // The post stays on a timeout or cancel: the next recv_body waits for it again (its
  // memory is the caller's until then, as post_recv says).
  if (!st.ok()) return st;
  if (Status failed = body_error(p.ops); !failed.ok()) {
    current_post_.reset();
    return failed;
  }
  for (size_t i = 0; i < p.ops.size(); ++i)  // posted with room to spare: the sizes are checked
    if (p.ops[i]->len != std::min(seg, n - i * seg)) {
      current_post_.reset();
      return corrupt("a body segment of the wrong size").status();
    }
  if (!dest.empty() && dest.data() != p.dest.data()) std::memcpy(dest.data(), p.dest.data(), n);
  current_post_.reset();
  body_pending_ = false;
  if (probe_) probe_->heard();
  return {};
}

Status OfiConnection::recv_body(std::span<std::byte> dest, Deadline deadline, const CancelToken& cancel) {
  if (peer_lost_.load()) return peer_lost_status();
  if (!broken_.empty()) return detail::repeated_status(StatusCode::unavailable, "libfabric: {}", broken_);
  if (!body_pending_) {
    if (dest.empty() || body_size_ == 0) return {};
    return make_status(StatusCode::invalid_argument, "libfabric: no body announced (call recv_header first)");
  }
  const size_t n = body_size_;
  if (!dest.empty() && dest.size() < n)
    return make_status(StatusCode::invalid_argument, "libfabric: body of {} bytes does not fit {} bytes", n,
                       dest.size());
  if (current_post_ && !current_post_->dest.empty()) return recv_posted_body(dest, deadline, cancel);
  current_post_.reset();  // reserved for recv_body alone
  Core& core = ep_->core();
  const uint64_t seq = recv_seq_ - 1;
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
  // A body sent on our clear arrives after its receives are posted: one already
  // queued came without it and is discarded (a receive matching a large queued
  // message of a peer that hung up crashes ofi_rxm 1.17: Core::cleared_bodies), as
  // is a queued one larger than the inject size that was not to wait (those are sent
  // at once, eager). A body that times out after its clear ends the connection, so
  // no retry ever takes one from the queue.
  const std::optional<size_t> keep = body_waits_ ? 0 : core.inject;
  if (Status st = post_body_recvs(seq, base, n, desc, keep, deadline, body_ops_,
                                  scratch_holder ? scratch_holder->buf : nullptr);
      !st.ok())
    return fail_body(st);
  if (body_waits_) {
    if (Status st = send_clear(seq, deadline, cancel); !st.ok()) {
      for (auto& o : body_ops_) ep_->cancel_and_drain(*o);
      return fail_body(st);
    }
  }
  auto st = wait_body(body_ops_, deadline, cancel);
  if (!st.ok()) {
    // Nothing may write into the caller's buffer after we return.
    for (auto& o : body_ops_)
      if (!ep_->cancel_and_drain(*o, 30s)) {
        broken_ = "a body receive could not be cancelled";
        KVS_LOG_ERROR("libfabric: a receive into a caller's buffer could not be cancelled");
      }
    Status failed = fail_body(st);
    // Once its clear went out the body may come at any time, and a receive posted
    // later would have to take it from the queue, where ofi_rxm cannot hand over a
    // large message of a peer that hung up since: the connection ends here.
    if (!failed.ok() && body_waits_ && broken_.empty()) {
      broken_ = "a body did not come in time after its clear";
      KVS_LOG_WARN("libfabric: connection to {} unusable: {}", peer_name_, broken_);
    }
    return failed;
  }
  Status failed = body_error(body_ops_);
  body_ops_.clear();
  if (!failed.ok()) return failed;
  body_pending_ = false;
  if (probe_) probe_->heard();
  return {};
}

Status OfiConnection::body_error(const std::vector<std::shared_ptr<Op>>& ops) {
  for (auto& o : ops)
    if (o->err) {
      auto e = peer_fault(side_, StatusCode::unavailable, "libfabric: body from {} failed: {}", peer_name_,
                          fi_err(o->err));
      broken_ = e.message();
      return e;
    }
  return {};
}

Status OfiConnection::wait_body(const std::vector<std::shared_ptr<Op>>& ops, Deadline deadline,
                                const CancelToken& cancel) {
  return wait_on_peer(
      [&] {
        for (auto& o : ops)
          if (!o->done.load(std::memory_order_acquire)) {
            progress_sends();
            return false;
          }
        return true;
      },
      deadline, cancel, "recv_body");
}

Status OfiConnection::send_clear(uint64_t seq, Deadline deadline, const CancelToken& cancel) {
  auto op = ep_->new_op(sizeof(uint64_t));
  std::memcpy(op->buf.get(), &seq, sizeof seq);
  KVS_ASSIGN_OR_RETURN(void* desc, ep_->local_desc(*op));
  // Not waited for: its completion (or error) is reaped with the body's.
  return ep_->post_send(op, op->buf.get(), sizeof seq, desc, peer_.addr(), make_tag(MsgType::clear, id_, seq),
                        deadline, cancel);
}

Status OfiConnection::fail_body(const Status& st) {
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
  if (any_ok) {
    // The caller sees only its timeout or cancel (st); the connection's end is news.
    broken_ = "a body was partly received before a timeout or cancel";
    KVS_LOG_WARN("libfabric: connection to {} unusable: {}", peer_name_, broken_);
  }
  body_ops_.clear();  // nothing consumed: the caller may call recv_body again
  return st;
}

Result<size_t> OfiConnection::corrupt(std::string_view what) {
  broken_ = fmt::format("{} from {}", what, peer_name_);
  return peer_fault(side_, StatusCode::corrupt_data, "libfabric: {}", broken_);
}

}  // namespace kvstream::transport::ofi

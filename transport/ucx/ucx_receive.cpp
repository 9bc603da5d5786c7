// The receive side of a connection. Header receives are posted ahead in a ring of
// kHeaderRing slots; a body arrives one of four ways: inline in its header message,
// into memory the caller posted ahead (post_recv), into a staging buffer the
// background thread set up for a body nobody asked for in time (ucx_staging.cpp), or
// into a receive recv_body posts itself. Bodies received while the application is
// waiting go straight into the caller's buffer (no copy).
#include <cstring>

#include "core/log.hpp"
#include "transport/ucx/ucx_connection.hpp"

namespace kvstream::transport::ucx_detail {

using namespace std::chrono_literals;

namespace {

/// Posts the header receive for `seq` into its ring slot. Requires mu.
void post_header(Engine& e, ConnState& cs, uint32_t seq) {
  auto& slot = (*cs.ring)[seq % kHeaderRing];
  slot.seq = seq;
  slot.seen_at = {};
  post_tag_recv(e.worker, slot.buf.data(), slot.buf.size(), make_tag(cs.rx_id, kHeaderKind, seq), slot.op);
}

}  // namespace

bool ConnState::from_peer(const Slot& slot) const {
  if (!keyed) return true;
  if (slot.op.status == UCS_ERR_MESSAGE_TRUNCATED) return false;
  if (slot.op.status != UCS_OK) return true;
  if (slot.op.length < kKeyBytes) return false;
  uint64_t key;
  std::memcpy(&key, slot.buf.data(), kKeyBytes);
  return key == rx_key;
}

void repost_headers(Engine& e, ConnState& cs) {
  while (int32_t(cs.consumed + uint32_t(kHeaderRing) - cs.reposted) > 0) post_header(e, cs, cs.reposted++);
}

Result<size_t> UcxConnection::recv_header(std::vector<std::byte>& header, Deadline deadline,
                                          const CancelToken& cancel) {
  Engine& e = *eng_;
  // Everything happens in the wait's predicate, under the lock the wait holds anyway
  // (one lock per call on the small-message path): the first call reposts consumed
  // header slots, or asks for the previous message's unread body to be dropped.
  Result<size_t> out{size_t(0)};
  for (;;) {
    bool prepared = false, drop_body = false;
    Status s = e.wait(
        [&]() -> std::optional<Status> {
          if (cs_->ended_here) return cs_->failure();
          if (!prepared) {
            if (cs_->body_pending) {
              drop_body = true;
              return Status{};
            }
            repost_headers(e, *cs_);
            prepared = true;
          }
          auto& slot = (*cs_->ring)[cs_->rx_next % kHeaderRing];
          while (slot.op.done && !cs_->from_peer(slot)) drop_unkeyed_locked(slot);
          if (slot.op.done) {
            out = take_header_locked(header);
            return Status{};
          }
          if (cs_->failed) return cs_->failure();
          return std::nullopt;
        },
        deadline, &cancel, cs_->who, "recv_header");
    if (!s.ok()) return s;
    if (!drop_body) return out;
    KVS_RETURN_IF_ERROR(recv_body({}, deadline, cancel));  // the previous body was not read: drop it
  }
}

/// A header receive took a message without this connection's key: another peer of
/// the worker sent under this connection's rx id. It is dropped and the receive
/// posted again for the same sequence number, where the peer's own header then lands
/// (from UCX's unexpected queue if it came meanwhile). Requires mu.
void UcxConnection::drop_unkeyed_locked(ConnState::Slot& slot) {
  Engine& e = *eng_;
  slot.op.release();
  ++e.unkeyed_headers;
  KVS_LOG_DEBUG("ucx: dropped a message of {} bytes without the key of the connection to {} ({} so far)",
                slot.op.length, cs_->peer, e.unkeyed_headers);
  post_header(e, *cs_, slot.seq);
}

Result<size_t> UcxConnection::take_header_locked(std::vector<std::byte>& header) {
  Engine& e = *eng_;
  auto& slot = (*cs_->ring)[cs_->rx_next % kHeaderRing];
  slot.op.release();
  if (slot.op.status != UCS_OK) {
    if (cs_->failed) return cs_->failure();
    return peer_fault(cs_->side, StatusCode::unavailable, "ucx: receive from {} failed: {}", cs_->peer,
                      ucs_status_string(slot.op.status));
  }
  const size_t at = cs_->prefix_at();
  if (slot.op.length < at + kPrefix)
    return peer_fault(cs_->side, StatusCode::corrupt_data, "ucx: message header of {} bytes from {}", slot.op.length,
                      cs_->peer);
  uint64_t body_size;
  std::memcpy(&body_size, slot.buf.data() + at, kPrefix);
  const bool inl = (body_size & kInlineFlag) != 0;
  body_size &= ~kInlineFlag;
  size_t hend = slot.op.length;
  if (inl) {
    if (body_size == 0 || body_size > slot.op.length - at - kPrefix)
      return peer_fault(cs_->side, StatusCode::corrupt_data,
                        "ucx: message of {} bytes from {} announces {} inline body bytes", slot.op.length, cs_->peer,
                        body_size);
    hend -= size_t(body_size);
  }
  header.assign(slot.buf.data() + at + kPrefix, slot.buf.data() + hend);
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
      // A broken invariant. The post stays in the map (its memory is the caller's and
      // its Op ours, which close_conn keeps while the request is pending); nothing
      // more is received on this connection.
      cs_->fail(fmt::format("connection to {} unusable: a posted receive did not cancel", cs_->peer));
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

Status UcxConnection::post_recv(std::span<std::byte> dest) {
  Engine& e = *eng_;
  e.touch();
  std::lock_guard lk(e.mu);
  if (cs_->failed) return cs_->failure();
  if (int32_t(cs_->rx_next - cs_->post_next) > 0) cs_->post_next = cs_->rx_next;
  const uint32_t seq = cs_->post_next;
  if (uint32_t(seq - cs_->rx_next) >= (uint32_t(1) << 30))
    return make_status(StatusCode::resource_exhausted, "ucx: too many receives posted ahead");
  cs_->post_next++;
  // A body the background thread is receiving already (its header came in, and
  // nobody asked for it in time) has its receive: a second one with the same tag would
  // never be matched. recv_body copies it out of staging instead.
  if (dest.empty() || cs_->staged.count(seq)) return {};
  auto po = std::make_unique<ConnState::Posted>();
  po->dest = dest.data();
  po->capacity = dest.size();
  if (!post_tag_recv(e.worker, dest.data(), dest.size(), cs_->rx_body_tag(seq), po->op)) {
    const ucs_status_t st = po->op.status;
    KVS_LOG_ERROR("ucx: posting a receive from {} failed: {}", cs_->peer, ucs_status_string(st));
    return make_status(StatusCode::unavailable, "ucx: posting a receive from {} failed: {}", cs_->peer,
                       ucs_status_string(st));
  }
  cs_->posted.emplace(seq, std::move(po));
  return {};
}

Status UcxConnection::abandon_posts() {
  Engine& e = *eng_;
  e.touch();
  std::vector<Op*> ops;
  {
    std::lock_guard lk(e.mu);
    if (cs_->posted.empty()) return {};
    // The bodies that follow are out of step, whether or not these had landed.
    cs_->fail(fmt::format("receives posted ahead from {} were abandoned", cs_->peer), spdlog::level::debug);
    cs_->ended_here = true;
    for (auto& [seq, po] : cs_->posted) ops.push_back(&po->op);
  }
  if (!withdraw_receives(ops)) {
    // The entries stay with the connection state, which close_conn keeps while a
    // request may still point into it.
    KVS_LOG_ERROR("ucx: a receive posted ahead from {} did not end after cancel and endpoint close", cs_->peer);
    return make_status(StatusCode::internal,
                       "ucx: a receive posted ahead from {} could not be withdrawn; its memory may still be written "
                       "until the connection is destroyed",
                       cs_->peer);
  }
  std::lock_guard lk(e.mu);
  for (auto& [seq, po] : cs_->posted) po->op.release();
  cs_->posted.clear();
  return {};
}

Status UcxConnection::recv_body(std::span<std::byte> dest, Deadline deadline, const CancelToken& cancel) {
  Engine& e = *eng_;
  e.touch();
  std::unique_lock lk(e.mu);
  if (!cs_->body_pending) {
    if (dest.empty()) return {};
    return make_status(StatusCode::invalid_argument, "ucx: recv_body without a body announced by recv_header");
  }
  if (!dest.empty() && dest.size() < cs_->body_size)
    return make_status(StatusCode::invalid_argument, "ucx: body of {} bytes does not fit {} bytes", cs_->body_size,
                       dest.size());
  if (cs_->body_inline) return take_inline_body_locked(dest);
  if (cs_->posted.count(cs_->body_seq)) return recv_posted_body(lk, dest, deadline, cancel);
  if (cs_->staged.count(cs_->body_seq)) return recv_staged_body(lk, dest, deadline, cancel);
  if (cs_->failed) return cs_->failure();
  return recv_unexpected_body(lk, dest, deadline, cancel);
}

/// The pending body is done: the next header receive of its slot may be posted.
/// Requires mu.
void UcxConnection::finish_body_locked() {
  cs_->body_pending = false;
  cs_->body_claimed = false;
  cs_->body_inline = false;
  cs_->consumed = cs_->body_seq + 1;
}

/// The body came inside its header message (take_header_locked may already have
/// copied it into the caller's post). Requires mu.
Status UcxConnection::take_inline_body_locked(std::span<std::byte> dest) {
  if (!dest.empty() && dest.data() != cs_->body_posted_dest)
    std::memcpy(dest.data(), (*cs_->ring)[cs_->body_seq % kHeaderRing].buf.data() + cs_->body_inline_off,
                cs_->body_size);
  cs_->body_posted_dest = nullptr;
  finish_body_locked();
  return {};
}

/// Waits (mu not held) until a body receive completes, the connection fails, or the
/// deadline or cancel ends the wait.
Status UcxConnection::body_wait(const Op& op, Deadline deadline, const CancelToken& cancel) {
  return eng_->wait(
      [&]() -> std::optional<Status> {
        if (op.done) return Status{};
        if (cs_->failed) return cs_->failure();
        return std::nullopt;
      },
      deadline, &cancel, cs_->who, "recv_body");
}

/// Waits, with `lk` released, for a body receive that is already posted (ahead by
/// the caller or by staging). On success `lk` is held again; on an error it is not,
/// and the receive goes on: a retry picks it up.
Status UcxConnection::wait_for_body(std::unique_lock<std::mutex>& lk, const Op& op, Deadline deadline,
                                    const CancelToken& cancel) {
  lk.unlock();
  KVS_RETURN_IF_ERROR(body_wait(op, deadline, cancel));
  lk.lock();
  return {};
}

namespace {

/// What a completed body receive says: ok, failed, or not the size the header said.
Status body_outcome(const Op& op, size_t size, const ConnState& cs) {
  if (op.status != UCS_OK)
    return peer_fault(cs.side, StatusCode::unavailable, "ucx: body from {} failed: {}", cs.peer,
                      ucs_status_string(op.status));
  if (op.length != size)
    return peer_fault(cs.side, StatusCode::corrupt_data, "ucx: body from {} has {} bytes, header said {}", cs.peer,
                      op.length, size);
  return {};
}

}  // namespace

/// A completed receive of the pending body into `landed`: its outcome, and on success
/// the body copied to `dest` unless it landed there or is discarded.
Status UcxConnection::take_landed_body(Op& op, const std::byte* landed, std::span<std::byte> dest) {
  op.release();
  Status result = body_outcome(op, cs_->body_size, *cs_);
  if (result.ok() && !dest.empty() && dest.data() != landed) std::memcpy(dest.data(), landed, cs_->body_size);
  return result;
}

/// The body lands in memory the caller posted with post_recv; a body larger than the
/// post completes it with UCS_ERR_MESSAGE_TRUNCATED.
Status UcxConnection::recv_posted_body(std::unique_lock<std::mutex>& lk, std::span<std::byte> dest,
                                       Deadline deadline, const CancelToken& cancel) {
  const uint32_t seq = cs_->body_seq;
  ConnState::Posted* po = cs_->posted.find(seq)->second.get();
  KVS_RETURN_IF_ERROR(wait_for_body(lk, po->op, deadline, cancel));
  Status result = take_landed_body(po->op, po->dest, dest);
  cs_->posted.erase(seq);
  finish_body_locked();
  return result;
}

/// The background thread receives (or received) the body into a staging buffer.
Status UcxConnection::recv_staged_body(std::unique_lock<std::mutex>& lk, std::span<std::byte> dest,
                                       Deadline deadline, const CancelToken& cancel) {
  const uint32_t seq = cs_->body_seq;
  ConnState::Staged* st = cs_->staged.find(seq)->second.get();
  KVS_RETURN_IF_ERROR(wait_for_body(lk, st->op, deadline, cancel));
  Status result = take_landed_body(st->op, st->buf.get(), dest);
  eng_->staged_bytes -= st->size;
  cs_->staged.erase(seq);
  finish_body_locked();
  return result;
}

/// Nobody received the body yet: recv_body posts the receive itself, into `dest` or,
/// to discard the body, a scratch buffer. A wait that ends early withdraws the
/// receive, and the body stays pending (a retry may receive it).
Status UcxConnection::recv_unexpected_body(std::unique_lock<std::mutex>& lk, std::span<std::byte> dest,
                                           Deadline deadline, const CancelToken& cancel) {
  Engine& e = *eng_;
  const size_t size = cs_->body_size;
  std::byte* target = dest.data();
  if (dest.empty()) {
    cs_->direct_scratch.reset(new std::byte[size]);
    target = cs_->direct_scratch.get();
  }
  Op& op = cs_->direct_op;
  post_tag_recv(e.worker, target, size, cs_->rx_body_tag(cs_->body_seq), op);
  cs_->body_claimed = true;
  lk.unlock();
  Status s = body_wait(op, deadline, cancel);
  if (!s.ok()) withdraw_receives({&op});
  lk.lock();
  if (!op.done) {
    // UCX completes a cancelled receive, and every request of a force-closed
    // endpoint; this one did neither, so it may still write its buffer. The request
    // and the scratch buffer stay with the connection state (close_conn keeps it
    // until the worker is destroyed); the caller's buffer cannot be kept, so the
    // connection is failed and the error says so. body_claimed stays set: staging
    // never posts a second receive for this body.
    cs_->fail(fmt::format("connection to {} unusable: a body receive did not complete", cs_->peer));
    KVS_LOG_ERROR("ucx: a body receive from {} did not complete after cancel and endpoint close", cs_->peer);
    return make_status(StatusCode::internal,
                       "ucx: a body receive from {} did not complete after cancel and endpoint close; its buffer "
                       "may still be written",
                       cs_->peer);
  }
  op.release();
  cs_->direct_scratch.reset();
  if (op.status == UCS_OK && op.length == size) {
    finish_body_locked();
    return {};
  }
  cs_->body_claimed = false;  // the body is still pending: a retry may receive it
  if (!s.ok()) return s;
  if (op.status != UCS_OK && cs_->failed) return cs_->failure();
  return body_outcome(op, size, *cs_);
}

/// Withdraws receives nobody waits for any more: cancelled (an unmatched receive
/// completes at once; a matched one when its data comes), and if that does not
/// complete them, the endpoint force-closed (every request on it then completes with
/// an error), which breaks the connection. Whether they all completed.
bool UcxConnection::withdraw_receives(const std::vector<Op*>& ops) {
  Engine& e = *eng_;
  auto all_done = [&] {
    for (const Op* op : ops)
      if (!op->done) return false;
    return true;
  };
  {
    std::lock_guard lk(e.mu);
    for (Op* op : ops)
      if (!op->done && op->req) ucp_request_cancel(e.worker, op->req);
  }
  if (e.wait_quiet(all_done, 5s)) return true;
  KVS_LOG_WARN("ucx: a body receive from {} did not complete after cancel; closing the endpoint", cs_->peer);
  {
    std::lock_guard lk(e.mu);
    cs_->fail(fmt::format("connection to {} unusable after a body receive that did not cancel", cs_->peer));
    if (cs_->ep && !all_done()) force_close_locked();
  }
  return e.wait_quiet(all_done, 5s);
}

}  // namespace kvstream::transport::ucx_detail

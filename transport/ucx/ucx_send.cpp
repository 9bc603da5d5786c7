// The send side of a connection. post_send posts the header and body tag sends and
// returns a sequence number; the requests queue per connection (in order) and
// wait_sends reaps them (send() is post_send + wait_sends, in the base class). An
// interrupted or failed wait_sends breaks the connection: outstanding sends are
// cancelled, and the endpoint force-closed when UCX cannot cancel them, before it
// returns (no request reads a caller's body afterwards).
#include <cstring>

#include "core/log.hpp"
#include "transport/ucx/ucx_connection.hpp"

namespace kvstream::transport::ucx_detail {

using namespace std::chrono_literals;

void UcxConnection::reap_locked() {
  auto& q = cs_->sends;
  while (!q.empty() && q.front()->hop.done && q.front()->bop.done) {
    auto snd = std::move(q.front());
    q.pop_front();
    snd->hop.release();
    snd->bop.release();
    const ucs_status_t st = snd->hop.status != UCS_OK ? snd->hop.status : snd->bop.status;
    if (st != UCS_OK && cs_->tx_error_seq == 0) {
      cs_->tx_error_seq = snd->seq;
      cs_->fail(fmt::format("send to {} failed: {}", cs_->peer, ucs_status_string(st)), peer_fault_level(cs_->side));
    }
    cs_->tx_reaped = snd->seq;
    if (cs_->send_pool.size() < 64) cs_->send_pool.push_back(std::move(snd));
  }
}

bool UcxConnection::sends_done_locked() const {
  for (const auto& snd : cs_->sends)
    if (!snd->hop.done || !snd->bop.done) return false;
  return true;
}

void UcxConnection::cancel_sends(const Status& why) {
  Engine& e = *eng_;
  {
    std::lock_guard lk(e.mu);
    cs_->fail(fmt::format("connection to {} unusable after an interrupted send ({})", cs_->peer, why.message()));
    for (auto& snd : cs_->sends) {
      if (!snd->hop.done && snd->hop.req) ucp_request_cancel(e.worker, snd->hop.req);
      if (!snd->bop.done && snd->bop.req) ucp_request_cancel(e.worker, snd->bop.req);
    }
  }
  if (!e.wait_quiet([&] { return sends_done_locked(); }, kAfterCancel)) {
    std::lock_guard lk(e.mu);
    if (cs_->ep && !sends_done_locked()) force_close_locked();
  }
  // With the endpoint force-closed no request reads the caller's body any more, but
  // UCX 1.13 never completes a rendezvous send whose peer died before answering its
  // RTS (the requests were still out when the worker went). Waiting 5 s for them
  // made about 1 in 20 puts to a killed node fail after 5.2 s instead of 10 ms; they
  // stay queued in the connection state instead, which close_conn keeps until the
  // worker is gone.
  if (!e.wait_quiet([&] { return sends_done_locked(); }, kAfterCancel))
    KVS_LOG_DEBUG("ucx: send requests to {} left with UCX after the endpoint was force-closed", cs_->peer);
  std::lock_guard lk(e.mu);
  reap_locked();
}

Result<uint64_t> UcxConnection::post_send(std::span<const std::byte> header, std::span<const std::byte> body) {
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
  const bool inl =
      !body.empty() && cs_->peer_inline_ok && !e.ctx->cuda && header.size() + body.size() <= kMaxHeaderBytes;
  const uint64_t body_size = body.size() | (inl ? kInlineFlag : 0);
  const size_t at = cs_->prefix_at();
  if (at) std::memcpy(snd->hbuf.data(), &cs_->peer_key, kKeyBytes);
  std::memcpy(snd->hbuf.data() + at, &body_size, kPrefix);
  if (!header.empty()) std::memcpy(snd->hbuf.data() + at + kPrefix, header.data(), header.size());
  snd->hlen = at + kPrefix + header.size();
  if (inl) {
    std::memcpy(snd->hbuf.data() + snd->hlen, body.data(), body.size());
    snd->hlen += body.size();
  }
  snd->hop.arm();
  snd->bop.arm();
  snd->bop.complete(UCS_OK);
  ucp_request_param_t p = send_param(snd->hop);
  bool ok = snd->hop.track(
      ucp_tag_send_nbx(cs_->ep, snd->hbuf.data(), snd->hlen, make_tag(cs_->peer_rx_id, kHeaderKind, wire_seq), &p));
  if (ok && !body.empty() && !inl) {
    snd->bop.arm();
    p.user_data = &snd->bop;
    ok = snd->bop.track(
        ucp_tag_send_nbx(cs_->ep, body.data(), body.size(), cs_->tx_body_tag(wire_seq), &p));
  }
  const uint64_t seq = snd->seq;
  const ucs_status_t st = snd->hop.status != UCS_OK && snd->hop.done ? snd->hop.status : snd->bop.status;
  cs_->sends.push_back(std::move(snd));
  if (!ok) {
    // Half a message may be on the wire: the stream is unusable from here on.
    cs_->fail(fmt::format("send to {} failed: {}", cs_->peer, ucs_status_string(st)), peer_fault_level(cs_->side));
    reap_locked();
    return cs_->failure();
  }
  return seq;
}

Status UcxConnection::wait_sends(uint64_t seq, Deadline deadline, const CancelToken& cancel) {
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
      deadline, &cancel, cs_->who, "send");
  if (!s.ok()) cancel_sends(s);
  return s;
}

}  // namespace kvstream::transport::ucx_detail


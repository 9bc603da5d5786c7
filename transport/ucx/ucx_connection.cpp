// A connection's teardown: the peer failing (the endpoint's error handler), the
// endpoint closed gracefully with every request waited for, or force-closed at once
// when a broken connection must not let any request touch a caller's buffer.
#include "transport/ucx/ucx_connection.hpp"

#include "core/log.hpp"

namespace kvstream::transport::ucx_detail {

using namespace std::chrono_literals;

bool ConnState::requests_done() const {
  if (!hello_op.done || !direct_op.done) return false;
  for (const auto& slot : *ring)
    if (!slot.op.done) return false;
  for (const auto& [seq, st] : staged)
    if (!st->op.done) return false;
  for (const auto& [seq, po] : posted)
    if (!po->op.done) return false;
  for (const auto& snd : sends)
    if (!snd->hop.done || !snd->bop.done) return false;
  for (const auto& op : stray_reads)
    if (!op->done) return false;
  return true;
}

void ep_error_cb(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* cs = static_cast<ConnState*>(arg);
  cs->fail(fmt::format("peer {} failed: {}", cs->peer, ucs_status_string(status)), spdlog::level::debug);
}

UcxConnection::~UcxConnection() { close_conn(*eng_, cs_); }

std::string UcxConnection::describe() const { return fmt::format("ucx {} ({})", cs_->peer, cs_->tls); }

void close_conn(Engine& eng, const std::shared_ptr<ConnState>& cs) {
  Op close_op;
  {
    std::lock_guard lk(eng.mu);
    cs->closed = true;
    auto cancel = [&](const Op& op) {
      if (!op.done && op.req) ucp_request_cancel(eng.worker, op.req);
    };
    for (auto& slot : *cs->ring) cancel(slot.op);
    for (auto& [seq, st] : cs->staged) cancel(st->op);
    for (auto& [seq, po] : cs->posted) cancel(po->op);
    cancel(cs->direct_op);
    destroy_rkeys_locked(*cs);  // before the endpoint they were unpacked on goes
    if (cs->ep) {
      // Sends posted but never waited for: flushed by the graceful close below.
      close_op.arm();
      ucp_request_param_t p = send_param(close_op);
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = cs->failed ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      close_op.track(ucp_ep_close_nbx(cs->ep, &p));
    }
  }
  // A graceful close flushes the sends posted but never waited for; a failed
  // connection's requests end at once or never (ucx_send.cpp, cancel_sends), so it
  // gets the short wait.
  const bool failed = cs->failed;
  const bool ok =
      eng.wait_quiet([&] { return close_op.done && cs->requests_done(); }, failed ? kAfterCancel : kGracefulClose);
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
  if (ok) {
    // Otherwise the staging buffers stay with the state: a receive may still land in them.
    cs->staged.clear();
    for (auto& [seq, po] : cs->posted) po->op.release();
    cs->posted.clear();
    cs->direct_op.release();
    for (auto& op : cs->stray_reads) op->release();
    cs->stray_reads.clear();
  }
  eng.by_ep.erase(cs->ep);
  eng.conns.erase(cs.get());
  if (!ok) {
    if (failed)
      KVS_LOG_DEBUG("ucx: connection to {} closed with requests UCX never ended (the peer failed)", cs->peer);
    else
      KVS_LOG_WARN("ucx: connection to {} did not close cleanly", cs->peer);
    eng.graveyard.push_back(cs);  // requests may still point into it
  }
}

void force_close_endpoint(ucp_ep_h ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* r = ucp_ep_close_nbx(ep, &p);
  if (r && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
}

void UcxConnection::force_close_locked() {
  destroy_rkeys_locked(*cs_);
  force_close_endpoint(cs_->ep);
  eng_->by_ep.erase(cs_->ep);
  cs_->ep = nullptr;
}

}  // namespace kvstream::transport::ucx_detail

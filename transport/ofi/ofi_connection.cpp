// A libfabric connection's lifecycle: the bye receive posted at start, and the
// orderly close that lets sends finish and tells the peer how many messages it sent.
#include "transport/ofi/ofi_connection.hpp"

#include <rdma/fi_errno.h>

#include <cstring>

#include "core/log.hpp"

namespace kvstream::transport::ofi {

using namespace std::chrono_literals;

OfiConnection::OfiConnection(std::shared_ptr<Endpoint> ep, PeerTable::Use peer, uint32_t id, std::string peer_name,
                             Side side, Endpoint::Expectation hold)
    : ep_(std::move(ep)), expect_(hold ? std::move(hold) : ep_->expect(id)), peer_(std::move(peer)), id_(id), peer_name_(std::move(peer_name)), side_(side),
      shared_(std::make_shared<ConnShared>()) {}

Status OfiConnection::start() {
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
  KVS_RETURN_IF_ERROR(ep_->post_recv(bye_op_, bye_op_->buf.get(), sizeof(uint64_t), desc, make_tag(MsgType::bye, id_),
                                     0, deadline_in(5s), recv_from()));
  if (!ep_->core().cleared_bodies) return {};
  {
    std::lock_guard lock(shared_->conn_mu);
    shared_->conn = this;
  }
  return post_clear_recv();
}

OfiConnection::~OfiConnection() {
  if (responder_) responder_->remove(id_);
  // Let our sends finish (bounded), then say bye so the peer stops waiting at once.
  // Sends still outstanding then are cancelled: their bodies are the caller's. A peer
  // found gone (no answer to a liveness probe) gets neither the wait nor the bye.
  if (!peer_lost_) {
    (void)ep_->wait(
        [&] {
          (void)flush();
          reap();
          return outstanding_.empty() || shared_->send_error.load() != 0;
        },
        deadline_in(2s), nullptr, "close");
  }
  if (!outstanding_.empty()) abort_sends();
  // A peer that said bye is gone: sending to it is pointless, and with shm in one
  // process its memory may already be unmapped. Give its bye a moment to be reaped.
  (void)ep_->wait([&] { return shared_->bye.load(); }, deadline_in(3ms), nullptr, "close");
  // After our own abort (FI_ECANCELED) the peer is alive: it still gets the bye, so
  // it neither waits for more nor sends to an endpoint that is going away.
  if (const int e = shared_->send_error.load();
      (e == 0 || e == FI_ECANCELED) && !shared_->bye.load() && !peer_lost_) {
    auto op = ep_->new_op(sizeof(uint64_t));
    const uint64_t n = send_seq_;
    std::memcpy(op->buf.get(), &n, sizeof n);
    auto desc = ep_->local_desc(*op);
    if (desc.ok() && ep_->post_send(op, op->buf.get(), sizeof n, *desc, peer_.addr(), make_tag(MsgType::bye, id_),
                                    deadline_in(500ms), CancelToken{})
                         .ok())
      (void)ep_->wait([&] { return op->done.load(); }, deadline_in(500ms), nullptr, "bye");
  }
  {
    std::lock_guard lock(shared_->conn_mu);  // a clear's callback running now ends first
    shared_->conn = nullptr;
  }
  std::shared_ptr<Op> clear_op;
  {
    std::lock_guard lock(clears_mu_);
    clear_op = std::move(clear_op_);
  }
  if (clear_op) ep_->cancel_and_drain(*clear_op, 1s);
  if (bye_op_) ep_->cancel_and_drain(*bye_op_, 1s);
  if (hdr_op_) ep_->cancel_and_drain(*hdr_op_, 1s);
  for (auto& op : body_ops_) ep_->cancel_and_drain(*op, 1s);
  for (auto& p : posted_) withdraw(p);
  if (current_post_) withdraw(*current_post_);
}

void OfiConnection::answer_probes(std::shared_ptr<ProbeResponder> responder, uint64_t nonce) {
  responder_ = std::move(responder);
  responder_->add(id_, nonce, peer_.addr());
}

Status OfiConnection::lost_peer(const Status& why) {
  // The sending and the receiving side may both find it: the first says so, and its
  // reason is every later call's.
  {
    std::lock_guard lock(lost_mu_);
    if (peer_lost_.load()) return peer_lost_status_locked();
    lost_why_ = why.message();
    peer_lost_.store(true);
  }
  return peer_fault(side_, StatusCode::unavailable, "libfabric: peer {} lost: {}", peer_name_, why.message());
}

Status OfiConnection::peer_lost_status() const {
  std::lock_guard lock(lost_mu_);
  return peer_lost_status_locked();
}

Status OfiConnection::peer_lost_status_locked() const {
  return detail::repeated_status(StatusCode::unavailable, "libfabric: peer {} lost: {}", peer_name_,
                                 lost_why_.empty() ? std::string("found gone by its liveness probe") : lost_why_);
}

std::string OfiConnection::describe() const {
  return fmt::format("libfabric {} ({})", peer_name_, ep_->core().provider);
}

}  // namespace kvstream::transport::ofi

// Probes and their answers: see ofi_liveness.hpp.
#include "transport/ofi/ofi_liveness.hpp"

#include <atomic>
#include <cstring>

#include "core/log.hpp"
#include "transport/common/random_fill.hpp"
#include "transport/ofi/ofi_handshake.hpp"
#include "transport/ofi/ofi_wire.hpp"

namespace kvstream::transport::ofi {

namespace {

int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

// ---- Listener side ------------------------------------------------------------------

Result<std::shared_ptr<ProbeResponder>> ProbeResponder::start(std::shared_ptr<Endpoint> ep) {
  auto r = std::shared_ptr<ProbeResponder>(new ProbeResponder(std::move(ep)));
  std::lock_guard lock(r->mu_);
  r->refill_locked();
  if (r->posted_.empty())
    return make_status(StatusCode::unavailable, "libfabric: cannot post a receive for liveness probes");
  return r;
}

ProbeResponder::~ProbeResponder() {
  // No callback can reach this object any more (they hold a weak pointer); the
  // receives are cancelled so the provider lets go of their buffers.
  for (auto& op : posted_) ep_->cancel_and_drain(*op, std::chrono::seconds(1));
}

uint32_t ProbeResponder::draw_id() const {
  static std::atomic<uint32_t> next{1};  // where the kernel has no random bits: in order
  std::lock_guard lock(mu_);
  for (;;) {
    uint32_t id = 0;
    if (!random_fill(&id, sizeof id)) id = next++;
    id &= uint32_t(Tag::kConnMask);
    if (id != 0 && !live_.contains(id)) return id;
  }
}

void ProbeResponder::add(uint32_t id, uint64_t nonce, fi_addr_t peer) {
  std::lock_guard lock(mu_);
  live_[id] = {nonce, peer};
}

void ProbeResponder::remove(uint32_t id) {
  std::lock_guard lock(mu_);
  live_.erase(id);
}

bool ProbeResponder::knows(uint32_t id, uint64_t nonce) const {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  return it != live_.end() && it->second.nonce == nonce;
}

void ProbeResponder::refill_locked() {
  std::erase_if(posted_, [](const std::shared_ptr<Op>& o) { return o->done.load(); });
  while (posted_.size() < kPool) {
    auto op = ep_->new_op(sizeof(Probe));
    op->on_complete = [w = weak_from_this()](Op& o) {
      if (auto self = w.lock()) self->answer(o);
    };
    auto desc = ep_->local_desc(*op);
    // One attempt (a deadline already passed): this runs in completion callbacks, and
    // a receive the provider has no room for now is posted at the next probe.
    if (!desc.ok() || !ep_->post_recv(op, op->buf.get(), sizeof(Probe), *desc, make_tag(MsgType::probe, 0),
                                      Tag::kBelowKind, Clock::now())
                           .ok())
      break;
    posted_.push_back(std::move(op));
  }
  if (posted_.empty()) KVS_LOG_DEBUG("libfabric: no receive posted for liveness probes; they go unanswered");
}

void ProbeResponder::answer(const Op& op) {
  std::lock_guard lock(mu_);
  if (op.err == FI_ECANCELED) return;  // the responder is going away
  // Any other ending (a probe, junk under the probe's tag, a message too long for the
  // receive) is replaced, so junk cannot use up the posted receives and silence the
  // responder, which would make every probing client take this node for gone.
  refill_locked();
  if (op.err) return;
  Probe p{};
  if (op.len != sizeof p) return;  // not one of ours: no answer
  std::memcpy(&p, op.buf.get(), sizeof p);
  const TagFields f = Tag::unpack(op.tag);
  auto it = live_.find(uint32_t(f.conn));
  if (it == live_.end() || it->second.nonce != p.nonce) return;  // a connection this endpoint did not make
  // Best effort: a provider out of room drops the answer, and the prober asks again.
  const ssize_t r = ep_->try_inject(&p, sizeof p, it->second.peer, make_tag(MsgType::probe_ack, f.conn, f.seq));
  if (r != 0) KVS_LOG_DEBUG("libfabric: answer to a liveness probe not sent: {}", fi_err(int(-r)));
}

// ---- Connecting side ----------------------------------------------------------------

PeerProbe::PeerProbe(std::shared_ptr<Endpoint> ep, fi_addr_t peer, uint32_t id, uint64_t nonce,
                     std::chrono::milliseconds timeout, std::optional<ListenerCheck> listener,
                     bool answers_questions)
    : ep_(std::move(ep)), peer_(peer), id_(id), nonce_(nonce), timeout_(timeout), listener_(std::move(listener)),
      answers_questions_(answers_questions),
      heard_at_(std::make_shared<std::atomic<int64_t>>(ns_of(Clock::now()))),
      unknown_(std::make_shared<std::atomic<bool>>(false)) {}

PeerProbe::~PeerProbe() {
  if (answer_op_) ep_->cancel_and_drain(*answer_op_, std::chrono::seconds(1));
  if (unknown_op_) ep_->cancel_and_drain(*unknown_op_, std::chrono::seconds(1));
}

bool PeerProbe::ask_listener() {
  if (!unknown_op_) {
    auto op = ep_->new_op(sizeof(HelloAck));
    op->on_complete = [unknown = unknown_](Op& o) {
      HelloAck a{};
      if (o.err || o.len != sizeof a) return;
      std::memcpy(&a, o.buf.get(), sizeof a);
      if (a.magic == kUnknownMagic) unknown->store(true, std::memory_order_release);
    };
    auto desc = ep_->local_desc(*op);
    // Posted before the question goes out, so the answer cannot arrive unexpected.
    if (!desc.ok() ||
        !ep_->post_recv(op, op->buf.get(), sizeof(HelloAck), *desc, hello_ack_tag(nonce_), 0, Clock::now(), peer_).ok())
      return false;
    unknown_op_ = std::move(op);
  }
  auto q = hello_op(*ep_, kVerifyMagic, nonce_);
  if (!q.ok()) return true;  // cannot ask: the probe's timeout decides
  auto desc = ep_->local_desc(**q);
  if (!desc.ok()) return true;
  // One attempt, and not counted as a send that keeps the progress thread busy: to a
  // node that never takes it, it would spin that thread for the connection's life.
  return ep_->post_send(*q, (*q)->buf.get(), sizeof(Hello), *desc, peer_, make_tag(MsgType::hello, id_), Clock::now(),
                        {})
      .ok();
}

void PeerProbe::heard() { heard_at_->store(ns_of(Clock::now()), std::memory_order_relaxed); }

Status PeerProbe::check() {
  // One clock read: this runs in every pass of a waiting call's predicate.
  const auto now = Clock::now();
  const auto silent = std::chrono::nanoseconds(ns_of(now) - heard_at_->load(std::memory_order_relaxed));
  if (silent < timeout_ / 4) return {};
  std::lock_guard lock(mu_);
  // The sending and the receiving side both ask: a verdict one of them got holds for
  // the other too (a timeout does by itself; the listener check runs once).
  if (!gone_.ok()) return gone_;
  if (answer_op_ && answer_op_->done.load(std::memory_order_acquire)) {
    // Answered (heard_at_ moved), or the receive failed: the next probe starts afresh.
    answer_op_.reset();
    injected_ = false;
  }
  if (!answer_op_) {
    ++seq_;
    auto op = ep_->new_op(sizeof(Probe));
    op->on_complete = [heard = heard_at_](Op& o) {
      if (!o.err) heard->store(ns_of(Clock::now()), std::memory_order_relaxed);
    };
    KVS_ASSIGN_OR_RETURN(void* desc, ep_->local_desc(*op));
    // Posted before the probe goes out, so the answer cannot arrive unexpected.
    if (!ep_->post_recv(op, op->buf.get(), sizeof(Probe), desc, make_tag(MsgType::probe_ack, id_, seq_), 0,
                        Clock::now(), peer_)
             .ok())
      return {};  // no room now: probe on the next check
    answer_op_ = std::move(op);
    probe_sent_ = now;
    listener_checked_ = false;
    asked_ = false;
  }
  if (!injected_) {
    const Probe p{nonce_};
    const ssize_t r = ep_->try_inject(&p, sizeof p, peer_, make_tag(MsgType::probe, id_, seq_));
    // EAGAIN: the provider's queue is full, or ofi_rxm is (re)connecting to a peer that
    // may be gone; either way the probe is tried again on the next check.
    injected_ = r == 0;
    // The reasons below are not logged here: the connection that asked says once
    // that it lost its peer, and why.
    if (r != 0 && r != -FI_EAGAIN)
      return detail::unlogged_status(StatusCode::unavailable, "a liveness probe could not be sent: {}", fi_err(int(-r)));
  }
  if (listener_ && !listener_checked_ && now - probe_sent_ >= kListenerCheckAfter) {
    // Once a probe: the check may wait up to kListenerCheckAfter for a host that does
    // not answer at all.
    listener_checked_ = true;
    if (Status gone = (*listener_)(Clock::now() + timeout_); !gone.ok())
      return gone_ = detail::unlogged_status(StatusCode::unavailable, "its listener is gone: {}", gone.message());
  }
  // Something listens there, or no check can tell: a node that restarted listens
  // again but answers no probe for a connection it did not make. Ask it.
  if (answers_questions_ && !asked_ && now - probe_sent_ >= kListenerCheckAfter) asked_ = ask_listener();
  if (unknown_->load(std::memory_order_acquire))
    return gone_ = detail::unlogged_status(StatusCode::unavailable,
                                           "its node no longer knows this connection (it restarted)");
  if (now - probe_sent_ >= timeout_)
    return detail::unlogged_status(StatusCode::unavailable, "it answered no liveness probe for {} ms (gone, or cut off)",
                                   timeout_.count());
  return {};
}

}  // namespace kvstream::transport::ofi

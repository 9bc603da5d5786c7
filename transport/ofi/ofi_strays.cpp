// Stray messages on a libfabric endpoint (ofi_strays.hpp): which tags are strays, the
// filters that reach all of them, the connections' holds on their ids, and the sweep
// that peeks at the unexpected queue and drops them.
#include "transport/ofi/ofi_strays.hpp"

#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <thread>

#include "core/log.hpp"
#include "transport/ofi/ofi_endpoint.hpp"

namespace kvstream::transport::ofi {

namespace {

/// This thread is sweeping: the completions its peeks route run callbacks, and no
/// sweep may start inside another.
thread_local bool t_sweeping = false;

constexpr unsigned kKindBits = 4, kConnBits = 20, kSeqBits = 24;
static_assert(Tag::pack({1, 0, 0, 0}) == uint64_t(1) << 60 && Tag::kSeqMask == (uint64_t(1) << kSeqBits) - 1 &&
                  Tag::kConnMask == (uint64_t(1) << kConnBits) - 1,
              "the cover's fields are the tag's");

/// Where the body window starts: the body of the header read last comes after it.
uint64_t body_from(uint64_t from) { return (from - 1) & Tag::kSeqMask; }

bool in_window(uint64_t seq, uint64_t from, uint64_t lead) { return ((seq - from) & Tag::kSeqMask) < lead; }

constexpr uint64_t kind_of(MsgType t) { return uint64_t(t); }

}  // namespace

bool is_stray(uint64_t tag, const Expected& e) {
  const TagFields f = Tag::unpack(tag);
  switch (MsgType(f.kind)) {
    case MsgType::hello:
    case MsgType::probe:
      return !e.listening;
    case MsgType::header:
    case MsgType::body:
    case MsgType::bye:
    case MsgType::clear:
      if (e.greeting) return false;
      break;
    default:  // hello-acks and probe answers meet a posted receive; other kinds are never sent
      return true;
  }
  auto [lo, hi] = std::equal_range(e.open.begin(), e.open.end(), ExpectedSpace{uint32_t(f.conn), 0},
                                   [](const ExpectedSpace& a, const ExpectedSpace& b) { return a.conn < b.conn; });
  for (auto it = lo; it != hi; ++it) {
    // A bye, or a clear (whose standing receive is posted again after each one).
    if (MsgType(f.kind) == MsgType::bye || MsgType(f.kind) == MsgType::clear) return false;
    const uint64_t from = it->from & Tag::kSeqMask;
    if (MsgType(f.kind) == MsgType::header && in_window(f.seq, from, kMaxLead)) return false;
    if (MsgType(f.kind) == MsgType::body && in_window(f.seq, body_from(from), kMaxLead + 1)) return false;
  }
  return true;
}

std::vector<TagFilter> stray_cover(const Expected& e) {
  std::vector<TagFilter> out;
  constexpr MsgType kConnKinds[] = {MsgType::header, MsgType::body, MsgType::bye, MsgType::clear};
  // Kinds nothing is kept under, whole.
  std::vector<uint64_t> kept;
  if (e.listening) kept = {kind_of(MsgType::hello), kind_of(MsgType::probe)};
  if (!e.open.empty() || e.greeting)
    for (MsgType k : kConnKinds) kept.push_back(kind_of(k));
  std::sort(kept.begin(), kept.end());
  const TagField kinds{Tag::kKindShift, kKindBits};
  cover_absent(kept, kKindBits, [&](uint64_t v, unsigned bits) { out.push_back(kinds.block(v, bits)); });
  if (e.open.empty() || e.greeting) return out;
  // Under a connection's kinds, the ids no open connection has.
  std::vector<uint64_t> ids;
  for (const auto& s : e.open) ids.push_back(s.conn);  // sorted already
  const uint64_t kind_mask = Tag::kKindMask << Tag::kKindShift;
  for (MsgType k : kConnKinds) {
    const TagField conns{Tag::kConnShift, kConnBits, kind_of(k) << Tag::kKindShift, kind_mask};
    cover_absent(ids, kConnBits, [&](uint64_t v, unsigned bits) { out.push_back(conns.block(v, bits)); });
  }
  // An open connection's headers and bodies outside its windows (segments alike).
  const uint64_t top_mask = kind_mask | (Tag::kConnMask << Tag::kConnShift);
  for (size_t i = 0; i < e.open.size(); ++i) {
    const ExpectedSpace& s = e.open[i];
    if ((i > 0 && e.open[i - 1].conn == s.conn) || (i + 1 < e.open.size() && e.open[i + 1].conn == s.conn))
      continue;  // open twice: the union of two windows is no window
    const uint64_t from = s.from & Tag::kSeqMask;
    const TagField header{Tag::kSeqShift, kSeqBits, make_tag(MsgType::header, s.conn), top_mask};
    cover_outside(from, kMaxLead, kSeqBits, [&](uint64_t v, unsigned bits) { out.push_back(header.block(v, bits)); });
    const TagField body{Tag::kSeqShift, kSeqBits, make_tag(MsgType::body, s.conn), top_mask};
    cover_outside(body_from(from), kMaxLead + 1, kSeqBits,
                  [&](uint64_t v, unsigned bits) { out.push_back(body.block(v, bits)); });
  }
  return out;
}

// ---- The connections' holds ----------------------------------------------------------

struct Endpoint::ExpectSlot {
  static constexpr uint32_t kGreeting = ~uint32_t(0);  // above every connection id
  uint32_t conn = 0;
  std::atomic<uint64_t> from{0};
};

Endpoint::Expectation& Endpoint::Expectation::operator=(Expectation&& o) noexcept {
  if (this != &o) {
    release();
    ep_ = std::exchange(o.ep_, nullptr);
    slot_ = std::move(o.slot_);
  }
  return *this;
}

void Endpoint::Expectation::read_up_to(uint64_t next) {
  if (slot_) slot_->from.store(next, std::memory_order_relaxed);
}

void Endpoint::Expectation::release() {
  if (!ep_ || !slot_) return;
  std::lock_guard lock(ep_->strays_mu_);
  if (slot_->conn == ExpectSlot::kGreeting) --ep_->greetings_;
  auto [lo, hi] = ep_->expected_.equal_range(slot_->conn);
  for (auto it = lo; it != hi; ++it)
    if (it->second == slot_) {
      ep_->expected_.erase(it);
      break;
    }
  ep_ = nullptr;
  slot_.reset();
}

Endpoint::Expectation Endpoint::expect(uint32_t conn) {
  Expectation e;
  e.ep_ = this;
  e.slot_ = std::make_shared<ExpectSlot>();
  e.slot_->conn = conn;
  std::lock_guard lock(strays_mu_);
  expected_.emplace(conn, e.slot_);
  return e;
}

Endpoint::Expectation Endpoint::expect_greeting() {
  Expectation e;
  e.ep_ = this;
  e.slot_ = std::make_shared<ExpectSlot>();
  e.slot_->conn = ExpectSlot::kGreeting;
  std::lock_guard lock(strays_mu_);
  ++greetings_;
  return e;
}

void Endpoint::set_listening() {
  std::lock_guard lock(strays_mu_);
  listening_ = true;
}

Expected Endpoint::expected() const {
  std::lock_guard lock(strays_mu_);
  return expected_locked(std::nullopt);
}

Expected Endpoint::expected_locked(std::optional<uint32_t> only) const {
  Expected e;
  e.listening = listening_;
  e.greeting = greetings_ > 0;
  auto add = [&](uint32_t conn, const ExpectSlot& slot) {
    e.open.push_back({conn, uint32_t(slot.from.load(std::memory_order_relaxed) & Tag::kSeqMask)});
  };
  if (only) {
    auto [lo, hi] = expected_.equal_range(*only);
    for (auto it = lo; it != hi; ++it) add(it->first, *it->second);
    return e;
  }
  e.open.reserve(expected_.size());
  for (const auto& [conn, slot] : expected_) add(conn, *slot);
  std::sort(e.open.begin(), e.open.end(), [](const auto& x, const auto& y) { return x.conn < y.conn; });
  return e;
}

std::optional<Listener::Strays> Endpoint::strays() const {
  if (!sweeps_.load()) return std::nullopt;
  return Listener::Strays{strays_dropped_.load(), stray_bytes_.load()};
}

bool Endpoint::waiting(uint64_t tag) { return sweeps_.load() && peek(tag, 0).has_value(); }

bool Endpoint::is_stray_now_locked(uint64_t tag) const {
  return is_stray(tag, expected_locked(uint32_t(Tag::unpack(tag).conn)));
}

// ---- The sweep -----------------------------------------------------------------------

Endpoint::PeekPost Endpoint::peek_locked(uint64_t tag, uint64_t ignore, fi_addr_t src, std::vector<Reaped>& got) {
  PeekPost out;
  out.op = new_op();
  out.op->quiet = true;
  track(out.op);
  fi_msg_tagged m{};
  m.addr = src;
  m.tag = tag;
  m.ignore = ignore;
  m.context = &out.op->ctx;
  if ((out.err = fi_trecvmsg(ep_, &m, FI_PEEK)) != 0) {
    untrack(out.op.get());
    return out;
  }
  for (int i = 0; !out.answer && i < 64; ++i) {
    const size_t before = got.size();
    if (read_locked(got) == 0) break;
    for (size_t j = before; j < got.size(); ++j)
      if (got[j].context == &out.op->ctx) out.answer = got[j];
  }
  return out;
}

std::optional<Endpoint::Peeked> Endpoint::peek(uint64_t tag, uint64_t ignore) {
  if (!ep_) return std::nullopt;
  // ofi_rxm answers within the call: the answer is read off the queue under the same
  // hold of the provider's lock, so that no other thread takes it and leaves this one
  // waiting while it routes it (on a loaded node such waits, each a yield of the CPU,
  // let a flood outrun the sweep). Whatever else is read with it is routed too.
  std::vector<Reaped> got;
  got.reserve(16);
  PeekPost pp;
  {
    std::lock_guard fl(fi_mu_);
    pp = peek_locked(tag, ignore, FI_ADDR_UNSPEC, got);
  }
  route(got);
  if (pp.err != 0) return std::nullopt;
  const std::shared_ptr<Op>& op = pp.op;
  // The bound is for a provider that answers late.
  for (int i = 0; i < 1000 && !op->done.load(std::memory_order_acquire); ++i)
    if (poll() == 0) std::this_thread::yield();
  if (!op->done.load(std::memory_order_acquire)) {
    // Left tracked: its answer, whenever it comes, is routed and dropped.
    KVS_LOG_WARN("libfabric: provider {} did not answer a peek at its queue; strays are no longer swept",
                 core_->provider);
    sweeps_.store(false);
    return std::nullopt;
  }
  if (op->err) return std::nullopt;  // FI_ENOMSG: nothing waits
  return Peeked{op->tag, op->len};
}

std::shared_ptr<Op> Endpoint::drop_if_stray(const Peeked& p) {
  if (!ep_) return nullptr;
  // Always discarded, never received: ofi_rxm 1.17 keeps a rendezvous message in its
  // queue after its sender's connection closed, and a receive that matches it then
  // reads through the closed connection and crashes the process (a peer that sends a
  // large stray and hangs up). A discard only frees the queued message. A live
  // rendezvous sender of a stray is not told: its send ends when its endpoint closes.
  auto op = stray_drop_op(p.len);
  fi_msg_tagged m{};
  m.addr = FI_ADDR_UNSPEC;
  m.tag = p.tag;
  m.context = &op->ctx;
  ssize_t r = 0;
  {
    // Judged by what is expected now, and taken before a connection can claim the id
    // (it registers under this lock before it posts a receive): a stray at the check
    // is one at the drop. The first message under its exact tag is the one peeked:
    // any older one matched the peek's filter too, and would have come first, so the
    // discard takes it at once.
    std::lock_guard lock(strays_mu_);
    if (!is_stray_now_locked(p.tag)) {
      untrack(op.get());
      return nullptr;
    }
    r = locked([&] { return fi_trecvmsg(ep_, &m, FI_PEEK | FI_DISCARD); });
  }
  if (r != 0) {
    untrack(op.get());
    return nullptr;
  }
  // Not waited for here: ofi_rxm takes the message off the queue within the call, and
  // its completion is reaped with the next peek's (one read of the queue per stray,
  // and so at most one message taken off the wire per stray dropped).
  return op;
}

std::shared_ptr<Op> Endpoint::stray_drop_op(size_t len) {
  auto op = new_op();
  op->quiet = true;
  op->on_complete = [this, len](Op& o) {
    if (o.err) return;
    strays_dropped_.fetch_add(1, std::memory_order_relaxed);
    stray_bytes_.fetch_add(len, std::memory_order_relaxed);
  };
  track(op);
  return op;
}

ssize_t Endpoint::discard_oversized_locked(uint64_t tag, uint64_t ignore, fi_addr_t src, size_t keep,
                                           std::vector<Reaped>& got) {
  // Each round: a peek at the first queued message the receive would match (ofi_rxm
  // answers within the call, its answer read here), and while that is larger than
  // the receive keeps, its discard (which frees the queued message and touches no
  // connection). Bounded: a queue that refills as fast is the sweep's to drain.
  for (int round = 0; round < 64; ++round) {
    const PeekPost pp = peek_locked(tag, ignore, src, got);
    if (pp.err != 0) return pp.err;
    if (!pp.answer) return -FI_EAGAIN;  // unanswered: no post over what may be queued (the peek is routed later)
    const Reaped* answer = &*pp.answer;
    if (answer->err || answer->len <= keep) return 0;  // nothing queued (FI_ENOMSG), or the first is fine
    const uint64_t found = answer->tag;
    auto drop = stray_drop_op(answer->len);
    fi_msg_tagged d{};
    d.addr = src;
    d.tag = found;
    d.context = &drop->ctx;
    if (const ssize_t r = fi_trecvmsg(ep_, &d, FI_PEEK | FI_DISCARD); r != 0) {
      untrack(drop.get());
      return r;
    }
    KVS_LOG_DEBUG("libfabric: discarded a queued message of {} bytes under tag {:#x} before a receive of {}",
                  answer->len, found, keep);
  }
  return -FI_EAGAIN;
}

void Endpoint::reap(std::vector<std::shared_ptr<Op>>& ops) {
  for (int i = 0; i < 1000; ++i) {
    std::erase_if(ops, [](const std::shared_ptr<Op>& o) { return o->done.load(std::memory_order_acquire); });
    if (ops.empty()) return;
    if (poll() == 0) std::this_thread::yield();
  }
}

Endpoint::Sweep Endpoint::sweep_strays(bool look_behind, std::chrono::nanoseconds stuck_after) {
  if (!sweeps_.load()) return {};
  std::lock_guard sweeping(sweep_mu_);
  return sweep_locked(look_behind, stuck_after);
}

Endpoint::Sweep Endpoint::sweep_locked(bool look_behind, std::chrono::nanoseconds stuck_after) {
  t_sweeping = true;
  struct Leave {
    ~Leave() { t_sweeping = false; }
  } leave;
  Sweep out;
  // The oldest waiting message first, for as long as it is a stray (a flood of them,
  // or what a closed connection left). Where nothing waits (the usual case) that is
  // one peek, answered "no message" within the call.
  std::optional<Peeked> head;
  std::vector<std::shared_ptr<Op>> drops;  // whose completions are not reaped yet
  auto note_drop = [&](std::shared_ptr<Op> drop) {
    drops.push_back(std::move(drop));
    if (drops.size() >= 256) std::erase_if(drops, [](const auto& o) { return o->done.load(std::memory_order_acquire); });
    ++out.dropped;
  };
  while (out.dropped < kMaxStraysPerSweep && (head = peek(0, ~uint64_t(0)))) {
    auto drop = drop_if_stray(*head);
    if (!drop) break;
    note_drop(std::move(drop));
    head.reset();
  }
  // Strays behind a kept message are reached only by peeks that skip it
  // (transport/common/kept_head.hpp).
  const bool stuck =
      kept_head_.stuck(head ? std::optional(head->tag) : std::nullopt, Clock::now(), stuck_after);
  out.looked_behind = look_behind && stuck;
  if (out.looked_behind)
    for (const TagFilter& f : stray_cover(expected())) {
      while (out.dropped < kMaxStraysPerSweep) {
        auto p = peek(f.tag, ~f.mask);
        auto drop = p ? drop_if_stray(*p) : nullptr;
        if (!drop) break;  // none left, or the filter is older than a new connection
        note_drop(std::move(drop));
      }
      if (out.dropped >= kMaxStraysPerSweep) break;
    }
  reap(drops);  // the counters are whole when the sweep returns
  if (out.dropped)
    KVS_LOG_DEBUG("libfabric: dropped {} stray message(s) no connection will receive ({} so far, {} bytes)",
                  out.dropped, strays_dropped_.load(), stray_bytes_.load());
  return out;
}

size_t Endpoint::sweep_when_due() {
  if (t_sweeping || !sweeps_.load(std::memory_order_relaxed) || !auto_sweep.load(std::memory_order_relaxed)) return 0;
  const auto now = Clock::now();
  const int64_t now_ns = now.time_since_epoch().count();
  int64_t last = last_sweep_ns_.load(std::memory_order_relaxed);
  if (now_ns - last < std::chrono::nanoseconds(kSweepEvery).count()) return 0;
  // One thread per interval, and none while another sweeps: a caller waiting for its
  // own completion does not wait for a sweep as well.
  if (!last_sweep_ns_.compare_exchange_strong(last, now_ns)) return 0;
  std::unique_lock lock(sweep_mu_, std::try_to_lock);
  if (!lock) return 0;
  const Sweep s = sweep_locked(now - last_look_behind_ >= kLookBehindEvery);
  if (s.looked_behind) last_look_behind_ = now;
  return s.dropped;
}

}  // namespace kvstream::transport::ofi

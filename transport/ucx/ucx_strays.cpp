// Stray messages (ucx_strays.hpp): which tags are strays, the probes that reach every
// one of them, and the engine's sweep that receives and drops them.
#include "transport/ucx/ucx_strays.hpp"

#include <algorithm>

#include "core/log.hpp"
#include "transport/ucx/ucx_connection.hpp"

namespace kvstream::transport::ucx_detail {

namespace {

// A tag's upper half is kind (8 bits) | rx id (24); its lower half the sequence.
static_assert(Tag::kConnShift == 32 && Tag::kKindShift == 56, "the sweep reads a tag as two 32-bit halves");

uint32_t top_of(uint32_t kind, uint32_t rx_id) { return kind << 24 | rx_id; }

const ExpectedSpace* find_open(std::span<const ExpectedSpace> open, uint32_t rx_id) {
  auto it = std::lower_bound(open.begin(), open.end(), rx_id,
                             [](const ExpectedSpace& s, uint32_t id) { return s.rx_id < id; });
  return it != open.end() && it->rx_id == rx_id ? &*it : nullptr;
}

}  // namespace

bool is_stray(uint64_t tag, std::span<const ExpectedSpace> open) {
  const TagFields f = Tag::unpack(tag);
  if (f.kind != kHeaderKind && f.kind != kBodyKind) return true;
  const ExpectedSpace* s = find_open(open, uint32_t(f.conn));
  if (!s) return true;
  const uint32_t seq = uint32_t(f.seq) ^ (f.kind == kBodyKind ? s->body_xor : 0);
  return uint32_t(seq - s->from) >= kMaxLead;
}

std::vector<TagFilter> stray_cover(std::span<const ExpectedSpace> open) {
  std::vector<uint64_t> tops;
  tops.reserve(open.size() * 2);
  for (const auto& s : open) {
    tops.push_back(top_of(uint32_t(kHeaderKind), s.rx_id));
    tops.push_back(top_of(uint32_t(kBodyKind), s.rx_id));
  }
  std::sort(tops.begin(), tops.end());
  std::vector<TagFilter> out;
  // Upper halves no open connection uses: whole blocks of them.
  const TagField top_field{32, 32};
  cover_absent(tops, 32, [&](uint64_t v, unsigned bits) { out.push_back(top_field.block(v, bits)); });
  // An open connection's sequences outside its window, a body's read through its key.
  for (const auto& s : open)
    for (uint64_t kind : {kHeaderKind, kBodyKind}) {
      const TagField seq{0, 32, uint64_t(top_of(uint32_t(kind), s.rx_id)) << 32, ~uint64_t(0) << 32};
      const uint64_t x = kind == kBodyKind ? s.body_xor : 0;
      cover_outside(s.from, kMaxLead, 32, [&](uint64_t v, unsigned bits) { out.push_back(seq.block(v, bits, x)); });
    }
  return out;
}

std::vector<ExpectedSpace> Engine::open_spaces_locked() const {
  std::vector<ExpectedSpace> open;
  open.reserve(conns.size());
  for (const ConnState* cs : conns) {
    // A failed connection still hands out what arrived before it failed; a closed
    // one takes nothing more.
    if (cs->closed) continue;
    open.push_back({cs->rx_id, cs->consumed, cs->keyed ? uint32_t(cs->rx_key >> 32) : 0});
  }
  std::sort(open.begin(), open.end(), [](const auto& a, const auto& b) { return a.rx_id < b.rx_id; });
  return open;
}

bool Engine::drop_stray_locked(uint64_t tag, uint64_t mask) {
  ucp_tag_recv_info_t info{};
  ucp_tag_message_h msg = ucp_tag_probe_nb(worker, tag, mask, 1, &info);
  if (!msg) return false;
  auto recv = std::make_unique<StrayReceive>();
  recv->op.arm();
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv = recv_cb;
  p.user_data = &recv->op;
  // Into a buffer smaller than most strays: UCX ends the receive truncated, after
  // telling a rendezvous sender that its send is done.
  recv->op.track(ucp_tag_msg_recv_nbx(worker, recv->buf.data(), recv->buf.size(), msg, &p));
  ++strays_dropped;
  stray_bytes += info.length;
  // The callback may have run inside the call (the data was all there) and still
  // left a request to free.
  if (recv->op.done)
    recv->op.release();
  else
    stray_receives.push_back(std::move(recv));
  return true;
}

Engine::Sweep Engine::sweep_strays_locked(bool look_behind, Clock::duration stuck_after) {
  std::erase_if(stray_receives, [](const std::unique_ptr<StrayReceive>& r) {
    if (!r->op.done) return false;
    r->op.release();
    return true;
  });
  Sweep out;
  size_t& dropped = out.dropped;
  // Bounded per sweep: the engine's mutex is held throughout, and the application's
  // calls wait for it.
  auto room = [&] { return stray_receives.size() < kMaxStrayReceives && dropped < kMaxStraysPerSweep; };
  // The oldest waiting message first, for as long as it is a stray (a flood of them,
  // or what a closed connection left). Where nothing waits (the usual case) that is
  // one probe, and the open connections are not looked at.
  ucp_tag_recv_info_t info{};
  std::vector<ExpectedSpace> open;
  bool looked = false, kept = false;
  while (room() && ucp_tag_probe_nb(worker, 0, 0, 0, &info)) {
    if (!looked) {
      open = open_spaces_locked();
      looked = true;
    }
    if (!is_stray(info.sender_tag, open)) {
      kept = true;
      break;
    }
    if (!drop_stray_locked(info.sender_tag, kExactTag)) break;
    ++dropped;
  }
  if (!looked) return out;
  // Strays behind a message kept for its connection are only reached by probes that
  // skip it (transport/common/kept_head.hpp).
  const bool stuck = kept_head_.stuck(kept ? std::optional(info.sender_tag) : std::nullopt, Clock::now(), stuck_after);
  out.looked_behind = look_behind && stuck;
  if (out.looked_behind)
    for (const TagFilter& f : stray_cover(open))
      while (room() && drop_stray_locked(f.tag, f.mask)) ++dropped;
  if (dropped)
    KVS_LOG_DEBUG("ucx: dropped {} stray message(s) no connection will receive ({} so far, {} bytes)", dropped,
                  strays_dropped, stray_bytes);
  return out;
}

}  // namespace kvstream::transport::ucx_detail

// Receive staging: a body whose header has arrived but which the application has not
// started to receive within kStageGrace of the background thread first seeing that
// header (it looks every millisecond) is received by the background thread into a
// staging buffer (bounded by UcxSettings::stage_limit_bytes per backend), so a sender
// never waits forever on a receiver that reads later (UCX's rendezvous needs the
// receiver to post). recv_body then copies it out.
#include <cstring>

#include "transport/ucx/ucx_connection.hpp"

namespace kvstream::transport::ucx_detail {

using namespace std::chrono_literals;

namespace {

constexpr auto kStageGrace = 2ms;

}  // namespace

bool Engine::stage(Clock::time_point now) {
  bool later = false;
  for (ConnState* cs : conns) {
    if (cs->failed || cs->closed || !cs->hello) continue;
    auto consider = [&](uint32_t seq, size_t size, Clock::time_point arrived) {
      if (size == 0 || cs->staged.count(seq) || cs->posted.count(seq)) return;
      if (now < arrived + kStageGrace) {
        later = true;
        return;
      }
      if (staged_bytes + size > stage_limit) return;  // the sender waits for the reader
      auto st = std::make_unique<ConnState::Staged>();
      st->buf.reset(new std::byte[size]);
      st->size = size;
      post_tag_recv(worker, st->buf.get(), size, cs->rx_body_tag(seq), st->op);
      staged_bytes += size;
      cs->staged.emplace(seq, std::move(st));
    };
    auto seen = [&](ConnState::Slot& slot) {
      if (slot.seen_at == Clock::time_point{}) slot.seen_at = now;
      return slot.seen_at;
    };
    // The body of the message recv_header returned, unless recv_body has claimed it.
    if (cs->body_pending && !cs->body_claimed && !cs->body_inline) {
      auto& slot = (*cs->ring)[cs->body_seq % kHeaderRing];
      consider(cs->body_seq, cs->body_size, seen(slot));
    }
    // The bodies of headers that arrived and wait in the ring, in order.
    for (uint32_t i = 0; i < kHeaderRing; ++i) {
      const uint32_t seq = cs->rx_next + i;
      auto& slot = (*cs->ring)[seq % kHeaderRing];
      // A message without the key stops the look-ahead: recv_header drops it when it
      // gets there, and the peer's header for that slot comes in after.
      const size_t at = cs->prefix_at();
      if (slot.seq != seq || !slot.op.done || slot.op.status != UCS_OK || !cs->from_peer(slot) ||
          slot.op.length < at + kPrefix)
        break;
      uint64_t size;
      std::memcpy(&size, slot.buf.data() + at, kPrefix);
      if (size & kInlineFlag) continue;  // nothing left on the wire
      consider(seq, size_t(size), seen(slot));
    }
  }
  return later;
}

}  // namespace kvstream::transport::ucx_detail

// The hello / hello-ack handshake: see ofi_handshake.hpp.
#include "transport/ofi/ofi_handshake.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <random>

#include <rdma/fi_errno.h>

#include "core/log.hpp"

namespace kvstream::transport::ofi {

using namespace std::chrono_literals;

Result<std::shared_ptr<Op>> post_hello_recv(Endpoint& ep, const std::shared_ptr<HelloQueue>& queue) {
  auto op = ep.new_op(sizeof(Hello));
  op->on_complete = [queue](Op& o) {
    Hello h{};
    const bool framed = !o.err && o.len >= offsetof(Hello, addr);
    if (framed) std::memcpy(&h, o.buf.get(), std::min(o.len, sizeof h));
    const bool sane = framed && h.addr_len <= kMaxAddrBytes;
    std::lock_guard lock(queue->mu);
    if (queue->closing) return;
    if (sane && h.magic == kHelloMagic)
      queue->hellos.push_back(h);
    else if (sane && h.magic == kVerifyMagic && queue->verifies.size() < HelloQueue::kMaxVerifies)
      queue->verifies.push_back({h, uint32_t(Tag::unpack(o.tag).conn)});
    else
      ++queue->spent;
    // Not answered: such a client would send its bodies at once, and this side
    // takes a body that comes before its clear for a stray (ofi_wire.hpp).
    if (sane && h.magic == kHelloMagicV1)
      KVS_LOG_WARN("libfabric: refused a client of the previous wire version (bodies sent before a clear); "
                   "upgrade clients and nodes together");
  };
  KVS_ASSIGN_OR_RETURN(void* desc, ep.local_desc(*op));
  KVS_RETURN_IF_ERROR(
      ep.post_recv(op, op->buf.get(), sizeof(Hello), desc, make_tag(MsgType::hello, 0), kNonceMask, deadline_in(5s)));
  return op;
}

Result<std::unique_ptr<Handshake>> begin_handshake(const std::shared_ptr<Endpoint>& ep, const Hello& hello,
                                                   uint32_t id, const std::shared_ptr<ProbeResponder>& responder) {
  auto hs = std::make_unique<Handshake>();
  hs->give_up = deadline_in(kHandshakeLimit);
  KVS_ASSIGN_OR_RETURN(PeerTable::Use peer, ep->peer(hello.addr, hello.addr_len));
  hs->peer = peer.addr();
  hs->id = id;
  hs->conn =
      std::make_unique<OfiConnection>(ep, std::move(peer), hs->id, ep->peer_name(hello.addr), Side::accepted);
  KVS_RETURN_IF_ERROR(hs->conn->start());
  hs->conn->answer_probes(responder, hello.nonce);
  // The ack, tagged with the client's nonce, tells it its connection id.
  hs->ack = ep->new_op(sizeof(HelloAck));
  const HelloAck ack{kHelloMagic, hs->id | kAnswersQuestions};
  std::memcpy(hs->ack->buf.get(), &ack, sizeof ack);
  KVS_ASSIGN_OR_RETURN(hs->desc, ep->local_desc(*hs->ack));
  hs->tag = hello_ack_tag(hello.nonce);
  return hs;
}

void answer_verify(Endpoint& ep, const ProbeResponder& responder, const HelloQueue::Verify& v) {
  if (responder.knows(v.id, v.hello.nonce)) return;  // its probes are answered
  auto peer = ep.peer(v.hello.addr, v.hello.addr_len);
  if (!peer.ok()) return;
  // A send with a completion, not an inject: the operation holds the peer's entry in
  // the address vector until the answer is out, and the entry goes after it (an
  // asker the node has no connection with would otherwise stay in it for good).
  auto op = ep.new_op(sizeof(HelloAck));
  const HelloAck unknown{kUnknownMagic, v.id};
  std::memcpy(op->buf.get(), &unknown, sizeof unknown);
  auto desc = ep.local_desc(*op);
  if (!desc.ok()) return;
  ssize_t r = -FI_EAGAIN;
  for (int i = 0; i < 100 && r == -FI_EAGAIN; ++i)
    if ((r = ep.try_send(op, op->buf.get(), sizeof unknown, *desc, peer->addr(), hello_ack_tag(v.hello.nonce))) ==
        -FI_EAGAIN)
      ep.poll();
  KVS_LOG_DEBUG("libfabric: told {} that connection {} is unknown here{}", ep.peer_name(v.hello.addr), v.id,
                r == 0 ? "" : fmt::format(" (not sent: {})", fi_err(int(-r))));
}

Result<bool> step_handshake(Endpoint& ep, Handshake& hs) {
  const auto now = Clock::now();
  if (!handshake_due(hs, now)) return false;
  if (!hs.posted && now >= hs.retry_at) {
    const ssize_t r = ep.try_send(hs.ack, hs.ack->buf.get(), sizeof(HelloAck), hs.desc, hs.peer, hs.tag);
    if (r == 0) {
      hs.posted = true;
    } else if (r != -FI_EAGAIN) {
      return peer_fault(Side::accepted, StatusCode::unavailable, "libfabric: hello-ack to {} not sent: {}",
                        hs.conn->describe(), fi_err(int(-r)));
    } else {
      // Doubling from 100 us: up to 1 ms while the handshake is young (a first ack
      // over ofi_rxm waits for its connection to the client, and each ms of it is the
      // client's), up to 20 ms after (one that cannot be reached costs little).
      const bool young = now - (hs.give_up - kHandshakeLimit) < 100ms;
      hs.retry_gap = std::clamp<Clock::duration>(hs.retry_gap * 2, 100us, young ? 1ms : 20ms);
      hs.retry_at = now + hs.retry_gap;
    }
  }
  if (hs.acked()) {
    if (hs.ack->err)
      return peer_fault(Side::accepted, StatusCode::unavailable, "libfabric: hello-ack to {} failed: {}",
                        hs.conn->describe(), fi_err(hs.ack->err));
    return true;
  }
  if (now >= hs.give_up)
    return peer_fault(Side::accepted, StatusCode::unavailable, "libfabric: hello-ack to {} did not complete in {} s",
                      hs.conn->describe(), kHandshakeLimit.count());
  return false;
}

bool handshake_due(const Handshake& hs, Clock::time_point now) {
  return hs.acked() || (!hs.posted && now >= hs.retry_at) || now >= hs.give_up;
}

Result<std::shared_ptr<Op>> hello_op(Endpoint& ep, uint32_t magic, uint64_t nonce) {
  KVS_ASSIGN_OR_RETURN(auto me, ep.name());
  if (me.size() > kMaxAddrBytes)
    return make_status(StatusCode::internal, "libfabric: endpoint address of {} bytes is too long", me.size());
  auto op = ep.new_op(sizeof(Hello));
  Hello h{};
  h.magic = magic;
  h.addr_len = uint32_t(me.size());
  h.nonce = nonce;
  std::memcpy(h.addr, me.data(), me.size());
  std::memcpy(op->buf.get(), &h, sizeof h);
  return op;
}

Result<Greeted> say_hello(Endpoint& ep, fi_addr_t server, const std::string& address, Deadline deadline,
                          const CancelToken& cancel, const ListenerCheck* listener) {
  uint64_t nonce = 0;
  {
    std::random_device rd;
    nonce = ((uint64_t(rd()) << 32) ^ rd() ^ uint64_t(Clock::now().time_since_epoch().count())) & kNonceMask;
  }
  // Until the connection holds its id, the stray sweep keeps what any connection
  // of this endpoint might be sent (the listener may speak first).
  const Endpoint::Expectation greeting = ep.expect_greeting();
  // Post the ack receive first, then say hello.
  auto ack = ep.new_op(sizeof(HelloAck));
  KVS_ASSIGN_OR_RETURN(void* adesc, ep.local_desc(*ack));
  KVS_RETURN_IF_ERROR(ep.post_recv(ack, ack->buf.get(), sizeof(HelloAck), adesc, hello_ack_tag(nonce), 0, deadline, server));
  KVS_ASSIGN_OR_RETURN(auto hello, hello_op(ep, kHelloMagic, nonce));
  KVS_ASSIGN_OR_RETURN(void* hdesc, ep.local_desc(*hello));
  auto fail = [&](Status s) -> Status {
    ep.cancel_and_drain(*ack, 1s);
    return s;
  };
  const std::string what = fmt::format("connect to {}", address);
  const auto post = [&](Deadline until) {
    return ep.post_send(hello, hello->buf.get(), sizeof(Hello), hdesc, server, make_tag(MsgType::hello, 0), until, cancel);
  };
  // A provider that cannot reach the listener answers the post with EAGAIN until the
  // deadline; the tries are bounded so that a listener that is gone shows early. The
  // check is made again after each (up to once a second): one that could not tell (a
  // loaded host slow to answer its connect) or a listener gone since is no verdict
  // for the whole deadline.
  auto step = std::chrono::duration_cast<Clock::duration>(kListenerCheckAfter);
  Deadline until = listener ? std::min(deadline, Clock::now() + step) : deadline;
  auto st = post(until);
  while (st.code() == StatusCode::timed_out && until < deadline && !cancel.cancelled()) {
    if (Status gone = (*listener)(deadline); !gone.ok())
      return fail(make_status(StatusCode::unavailable, "libfabric: connect to {}: {}", address, gone.message()));
    step = std::min<Clock::duration>(step * 2, std::chrono::seconds(1));
    until = std::min(deadline, Clock::now() + step);
    st = post(until);
  }
  if (!st.ok()) return fail(st.with_context(what));
  st = ep.wait([&] { return ack->done.load() || (hello->done.load() && hello->err); }, deadline, &cancel, what);
  if (!st.ok()) return fail(st);
  if (hello->done.load() && hello->err)
    return fail(make_status(StatusCode::unavailable, "libfabric: connect to {} failed: {}", address,
                            fi_err(hello->err)));
  HelloAck a{};
  std::memcpy(&a, ack->buf.get(), sizeof a);
  if (ack->err || ack->len != sizeof a || a.magic != kHelloMagic)
    return make_status(StatusCode::unavailable, "libfabric: bad hello-ack from {}", address);
  const uint32_t id = a.conn_id & ~kAnswersQuestions;
  return Greeted{id, nonce, (a.conn_id & kAnswersQuestions) != 0, ep.expect(id)};
}

}  // namespace kvstream::transport::ofi

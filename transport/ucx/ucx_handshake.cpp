// Connection setup: an endpoint, the connection's receive tag space (rx id), and the
// hello exchange that tells each side the other's rx id and whether it accepts
// inline bodies. The hello is an active message: its handler learns the sending
// endpoint from reply_ep, which is how the two ends pair up (UCP tag matching is per
// worker, not per endpoint).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/log.hpp"
#include "transport/common/random_fill.hpp"
#include "transport/ucx/ucx_connection.hpp"

namespace kvstream::transport::ucx_detail {

namespace {

ucs_status_t hello_cb(void* arg, const void* /*header*/, size_t /*header_length*/, void* data, size_t length,
                      const ucp_am_recv_param_t* param) {
  auto* e = static_cast<Engine*>(arg);
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || length < 8 ||
      (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
    return UCS_OK;
  uint32_t msg[kHelloWords] = {};
  std::memcpy(msg, data, std::min(length, sizeof msg));
  auto it = e->by_ep.find(param->reply_ep);
  const bool peer_keyed = (msg[2] & kHelloKeyed) != 0;
  if (msg[0] != kHelloMagic || it == e->by_ep.end() || (peer_keyed && length < sizeof msg)) {
    // Any peer can send one; nothing is lost by dropping it (a setup that waited for a
    // real hello ends by its own deadline, and says so).
    KVS_LOG_DEBUG("ucx: ignoring an unexpected hello message");
    return UCS_OK;
  }
  ConnState& cs = *it->second;
  cs.peer_rx_id = msg[1];
  cs.peer_inline_ok = (msg[2] & kHelloInlineOk) != 0;
  cs.keyed = peer_keyed && (cs.hello_out[2] & kHelloKeyed) != 0;
  cs.peer_key = uint64_t(msg[3]) | uint64_t(msg[4]) << 32;
  cs.hello = true;
  return UCS_OK;
}

/// A connection's key (ucx_wire.hpp). Without getrandom(2) (kernels before 3.17) the
/// key is made from the clock and the state's address: it still tells a peer's
/// messages from a stray one, not from a guess; said once.
uint64_t draw_key(const ConnState& cs) {
  uint64_t key = 0;
  if (random_fill(&key, sizeof key)) return key;
  static std::once_flag said;
  std::call_once(said, [] { KVS_LOG_WARN("ucx: getrandom(2) failed; connection keys are guessable"); });
  const auto now = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  return now * 0x9e3779b97f4a7c15ull ^ reinterpret_cast<uintptr_t>(&cs);
}

/// An rx id no live connection, nor one in the graveyard (whose receives may still be
/// posted under it), uses, drawn at random (getrandom(2)). UCP tag receives cannot
/// name their sender, so any peer of this worker can send under any rx id. The
/// connection's key keeps such messages out (ucx_wire.hpp); a random id also keeps a
/// peer from aiming at a connection, and is all there is on a connection to a peer
/// without keys. Requires mu.
uint32_t alloc_rx_id(Engine& e) {
  for (;;) {
    uint32_t id = 0;
    if (!random_fill(&id, sizeof id)) id = e.next_rx_id++;  // no entropy: in order
    id &= kRxIdMask;
    if (id == 0) continue;
    bool used = false;
    for (auto* c : e.conns) used |= c->rx_id == id;
    for (const auto& c : e.graveyard) used |= c->rx_id == id;
    if (!used) return id;
  }
}

/// The transports the endpoint's lanes use ("shm,tcp"), for describe().
std::string ep_transports(ucp_ep_h ep) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (!f) return "?";
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string text(buf, len);
  std::free(buf);
  // Lane lines look like "lane[0]:  1:tcp/lo.0 md[1] ..."; collect the transport names.
  std::vector<std::string> tls;
  size_t pos = 0;
  while ((pos = text.find("lane[", pos)) != std::string::npos) {
    const size_t eol = text.find('\n', pos);
    const std::string line = text.substr(pos, eol == std::string::npos ? std::string::npos : eol - pos);
    pos = eol == std::string::npos ? text.size() : eol;
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    size_t b = slash;
    while (b > 0 && (std::isalnum(static_cast<unsigned char>(line[b - 1])) || line[b - 1] == '_')) --b;
    const std::string tl = line.substr(b, slash - b);
    if (!tl.empty() && std::find(tls.begin(), tls.end(), tl) == tls.end()) tls.push_back(tl);
  }
  return tls.empty() ? std::string("?") : fmt::format("{}", fmt::join(tls, ","));
}

/// Creates the endpoint, posts the header receives and sends the hello. Requires mu.
Status start_locked(Engine& e, ConnState& cs, ucp_ep_params_t params) {
  cs.rx_id = alloc_rx_id(e);
  params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.err_mode = e.peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.cb = ep_error_cb;
  params.err_handler.arg = &cs;
  const ucs_status_t st = ucp_ep_create(e.worker, &params, &cs.ep);
  if (st != UCS_OK)
    return make_status(StatusCode::unavailable, "ucx: cannot create an endpoint to {}: {}", cs.peer,
                       ucs_status_string(st));
  e.by_ep[cs.ep] = &cs;
  e.conns.insert(&cs);
  repost_headers(e, cs);
  cs.rx_key = draw_key(cs);
  cs.hello_out[1] = cs.rx_id;
  // Inline bodies are copied with memcpy: only where no side can hold cuda bodies.
  cs.hello_out[2] = (e.ctx->cuda ? 0 : kHelloInlineOk) | (e.keyless_hello ? 0 : kHelloKeyed);
  cs.hello_out[3] = uint32_t(cs.rx_key);
  cs.hello_out[4] = uint32_t(cs.rx_key >> 32);
  cs.hello_op.arm();
  ucp_request_param_t p = send_param(cs.hello_op);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  const size_t words = e.keyless_hello ? 3 : kHelloWords;  // an old peer's hello has three
  cs.hello_op.track(ucp_am_send_nbx(cs.ep, kHelloAmId, nullptr, 0, cs.hello_out, words * sizeof(uint32_t), &p));
  return {};
}

}  // namespace

Status set_hello_handler(Engine& e) {
  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kHelloAmId;
  am.cb = &hello_cb;
  am.arg = &e;
  const ucs_status_t st = ucp_worker_set_am_recv_handler(e.worker, &am);
  if (st != UCS_OK)
    return make_status(StatusCode::unavailable, "ucx: ucp_worker_set_am_recv_handler: {}", ucs_status_string(st));
  return {};
}

Result<std::shared_ptr<ConnState>> begin_establish(Engine& e, ucp_ep_params_t params, std::string peer,
                                                   Side side) {
  auto cs = std::make_shared<ConnState>();
  cs->peer = std::move(peer);
  cs->side = side;
  cs->who = "ucx " + cs->peer;
  std::lock_guard lk(e.mu);
  KVS_RETURN_IF_ERROR(start_locked(e, *cs, params));
  return cs;
}

void abandon_establish(Engine& e, const std::shared_ptr<ConnState>& cs, std::string_view why) {
  {
    std::lock_guard lk(e.mu);
    // Force close: the peer may be absent.
    cs->fail(std::string(why), peer_fault_level(cs->side));
  }
  close_conn(e, cs);
}

Result<std::unique_ptr<Connection>> establish(const std::shared_ptr<Engine>& eng, ucp_ep_params_t params,
                                              std::string peer, Deadline deadline, const CancelToken* cancel) {
  KVS_ASSIGN_OR_RETURN(auto cs, begin_establish(*eng, params, std::move(peer), Side::connected));
  auto conn = finish_establish(eng, cs, deadline, cancel);
  if (!conn.ok() && (conn.status().code() == StatusCode::timed_out || conn.status().code() == StatusCode::cancelled))
    abandon_establish(*eng, cs, conn.status().message());
  return conn;
}

std::optional<Status> setup_outcome(const ConnState& cs) {
  if (cs.failed) return cs.failure();
  if (cs.hello_op.done && cs.hello_op.status != UCS_OK)
    return peer_fault(cs.side, StatusCode::unavailable, "ucx: handshake with {} failed: {}", cs.peer,
                      ucs_status_string(cs.hello_op.status));
  if (cs.hello && cs.hello_op.done) return Status{};
  return std::nullopt;
}

Result<std::unique_ptr<Connection>> finish_establish(const std::shared_ptr<Engine>& eng,
                                                     const std::shared_ptr<ConnState>& cs, Deadline deadline,
                                                     const CancelToken* cancel) {
  Engine& e = *eng;
  Status s = e.wait([&] { return setup_outcome(*cs); }, deadline, cancel, cs->who, "connection setup");
  if (!s.ok()) {
    // A deadline or cancel leaves the setup to the caller (establish closes it, a
    // listener keeps it for its next accept); a failure closes it here.
    if (s.code() != StatusCode::timed_out && s.code() != StatusCode::cancelled) abandon_establish(e, cs, s.message());
    return s;
  }
  {
    std::lock_guard lk(e.mu);
    cs->hello_op.release();
    cs->tls = ep_transports(cs->ep);
  }
  // A client's connection is news; a node's accepted ones would be a line each.
  detail::logger().log(cs->side == Side::accepted ? spdlog::level::debug : spdlog::level::info,
                       "ucx: connected to {} over {} ({})", cs->peer, cs->tls, e.ctx->provider);
  return std::unique_ptr<Connection>(std::make_unique<UcxConnection>(eng, std::move(cs)));
}

}  // namespace kvstream::transport::ucx_detail

// A UCX client made from the engine up, below the Connection API: for the tests and
// benchmarks that play a peer kvstream's own client never is (it can reach its
// endpoint and connection state, and send under any tag). No test framework here: a
// benchmark uses it too.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "kvstream/transport.hpp"
#include "transport/common/address.hpp"
#include "transport/ucx/ucx_connection.hpp"

namespace kvstream::test_ucx {

/// A client made from the engine up (ucx_handshake.cpp's two steps).
struct RawClient {
  std::shared_ptr<transport::ucx_detail::Engine> eng;
  std::shared_ptr<transport::ucx_detail::ConnState> cs;
  std::unique_ptr<transport::Connection> conn;
};

/// Connects a RawClient to `address`; `keyless`: hellos as a peer from before
/// connection keys sends them.
inline Result<RawClient> connect_raw(const transport::BackendConfig& cfg, const std::string& address,
                                     bool keyless = false) {
  using namespace kvstream::transport;
  using namespace kvstream::transport::ucx_detail;
  RawClient c;
  KVS_ASSIGN_OR_RETURN(c.eng, Engine::create(cfg));
  c.eng->keyless_hello = keyless;
  KVS_ASSIGN_OR_RETURN(auto addrs, resolve_address("ucx", address, false));
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addrs.front());
  params.sockaddr.addrlen = sockaddr_len(addrs.front());
  KVS_ASSIGN_OR_RETURN(c.cs, begin_establish(*c.eng, params, address, Side::connected));
  KVS_ASSIGN_OR_RETURN(c.conn, finish_establish(c.eng, c.cs, deadline_in(std::chrono::seconds(30)), nullptr));
  return c;
}

/// A peer that makes UCX's own connection to a listener and never says hello (a
/// hostile peer, or a client that died right after UCX's setup): it only notes that
/// the listener's hello came, which the listener sends once it has taken the request.
class SilentPeer {
 public:
  static Result<std::unique_ptr<SilentPeer>> connect(const transport::BackendConfig& cfg, const std::string& address) {
    using namespace kvstream::transport;
    using namespace kvstream::transport::ucx_detail;
    auto p = std::unique_ptr<SilentPeer>(new SilentPeer());
    KVS_ASSIGN_OR_RETURN(p->eng_, Engine::create(cfg));
    KVS_ASSIGN_OR_RETURN(auto addrs, resolve_address("ucx", address, false));
    std::lock_guard lk(p->eng_->mu);
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = kHelloAmId;
    am.cb = [](void* arg, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) -> ucs_status_t {
      static_cast<SilentPeer*>(arg)->hello_seen_.store(true);
      return UCS_OK;
    };
    am.arg = p.get();
    if (ucs_status_t st = ucp_worker_set_am_recv_handler(p->eng_->worker, &am); st != UCS_OK)
      return make_status(StatusCode::unavailable, "silent peer: {}", ucs_status_string(st));
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addrs.front());
    params.sockaddr.addrlen = sockaddr_len(addrs.front());
    if (ucs_status_t st = ucp_ep_create(p->eng_->worker, &params, &p->ep_); st != UCS_OK)
      return make_status(StatusCode::unavailable, "silent peer: ucp_ep_create: {}", ucs_status_string(st));
    return p;
  }

  ~SilentPeer() {
    if (!ep_) return;
    std::lock_guard lk(eng_->mu);
    transport::ucx_detail::force_close_endpoint(ep_);
  }

  /// Whether the listener's hello came within `limit` (the worker progressed meanwhile).
  bool hello_by(std::chrono::milliseconds limit) {
    return eng_->wait_quiet([&] { return hello_seen_.load(); }, limit);
  }

 private:
  SilentPeer() = default;
  std::shared_ptr<transport::ucx_detail::Engine> eng_;
  ucp_ep_h ep_ = nullptr;
  std::atomic<bool> hello_seen_{false};
};

}  // namespace kvstream::test_ucx

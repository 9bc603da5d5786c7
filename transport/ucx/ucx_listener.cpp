// Connection requests queue in the listener (UCX calls the handler inside progress,
// with the engine mutex held); accept waits for one and runs the handshake on it. A
// deadline or cancel that ends accept() while a taken request's handshake is still
// running leaves that handshake pending: the next accept() finishes it first, so a
// connection the client is already making is not reset because one accept round
// ended (the storage node accepts in 200 ms rounds; on a loaded machine a setup can
// outlast one). A setup not finished within kSetupLimit is dropped.
#include "transport/ucx/ucx_listener.hpp"

#include <deque>

#include "core/log.hpp"
#include "transport/common/address.hpp"
#include "transport/ucx/ucx_connection.hpp"

namespace kvstream::transport::ucx_detail {

namespace {

struct ListenState {
  ucp_listener_h h = nullptr;
  std::deque<ucp_conn_request_h> pending;  // guarded by the engine mutex
};

void conn_cb(ucp_conn_request_h req, void* arg) { static_cast<ListenState*>(arg)->pending.push_back(req); }

class UcxListener final : public Listener {
 public:
  UcxListener(std::shared_ptr<Engine> eng, std::unique_ptr<ListenState> ls, std::string addr)
      : eng_(std::move(eng)), ls_(std::move(ls)), addr_(std::move(addr)), who_("ucx " + addr_) {}

  ~UcxListener() override {
    if (setup_) abandon_establish(*eng_, setup_, "the listener closed during connection setup");
    std::lock_guard lk(eng_->mu);
    for (auto* r : ls_->pending) ucp_listener_reject(ls_->h, r);
    ls_->pending.clear();
    ucp_listener_destroy(ls_->h);
  }

  Result<std::unique_ptr<Connection>> accept(Deadline deadline, const CancelToken& cancel) override {
    if (!setup_) KVS_RETURN_IF_ERROR(take_request(deadline, cancel));
    const Deadline until = std::min(deadline, setup_give_up_);
    auto conn = finish_establish(eng_, setup_, until, &cancel);
    if (conn.ok() || (conn.status().code() != StatusCode::timed_out && conn.status().code() != StatusCode::cancelled)) {
      setup_.reset();  // made, or failed and closed by finish_establish
      return conn;
    }
    if (Clock::now() >= setup_give_up_) {
      auto st = peer_fault(Side::accepted, StatusCode::unavailable,
                           "ucx: connection setup with {} did not finish in {} s", setup_->peer, kSetupLimit.count());
      abandon_establish(*eng_, setup_, st.message());
      setup_.reset();
      return st;
    }
    return conn.status();  // the caller's deadline or cancel: the setup stays pending
  }

  [[nodiscard]] std::string address() const override { return addr_; }

  [[nodiscard]] std::optional<Strays> strays() const override {
    std::lock_guard lk(eng_->mu);
    return Strays{eng_->strays_dropped, eng_->stray_bytes};
  }

 private:
  static constexpr std::chrono::seconds kSetupLimit{10};

  // Waits for a connection request and starts its handshake (setup_).
  Status take_request(Deadline deadline, const CancelToken& cancel) {
    Engine& e = *eng_;
    KVS_RETURN_IF_ERROR(e.wait(
        [&]() -> std::optional<Status> {
          if (!ls_->pending.empty()) return Status{};
          return std::nullopt;
        },
        deadline, &cancel, who_, "accept"));
    ucp_conn_request_h req;
    std::string peer = "?";
    {
      std::lock_guard lk(e.mu);
      req = ls_->pending.front();
      ls_->pending.pop_front();
      ucp_conn_request_attr_t attr{};
      attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
      if (ucp_conn_request_query(req, &attr) == UCS_OK) peer = format_address(attr.client_address);
    }
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    params.conn_request = req;
    KVS_ASSIGN_OR_RETURN(setup_, begin_establish(e, params, peer, Side::accepted));
    setup_give_up_ = Clock::now() + kSetupLimit;
    return {};
  }

  std::shared_ptr<Engine> eng_;
  std::shared_ptr<ConnState> setup_;  // a taken request whose handshake an accept deadline interrupted
  Clock::time_point setup_give_up_{};
  std::unique_ptr<ListenState> ls_;
  std::string addr_;
  std::string who_;
};

/// The address a listener on `asked` is bound to: the host as given (a wildcard bind
/// reports 0.0.0.0), the port the listener really has (port 0 asks for any).
std::string bound_address(const std::string& asked, const sockaddr_storage& bound) {
  std::string host;
  uint16_t port = 0;
  (void)parse_host_port(asked, host, port);
  const std::string real = format_address(bound);
  const std::string real_port = real.substr(real.rfind(':') + 1);
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + real_port;
}

}  // namespace

Result<std::unique_ptr<Listener>> listen_on(const std::shared_ptr<Engine>& eng, const std::string& address) {
  KVS_ASSIGN_OR_RETURN(auto addrs, resolve_address("ucx", address, true));
  const sockaddr_storage& ss = addrs.front();
  auto ls = std::make_unique<ListenState>();
  Engine& e = *eng;
  std::lock_guard lk(e.mu);
  ucp_listener_params_t p{};
  p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  p.sockaddr.addrlen = sockaddr_len(ss);
  p.conn_handler.cb = conn_cb;
  p.conn_handler.arg = ls.get();
  const ucs_status_t st = ucp_listener_create(e.worker, &p, &ls->h);
  if (st != UCS_OK)
    return make_status(StatusCode::unavailable, "ucx: cannot listen on {}: {}", address, ucs_status_string(st));
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  std::string bound = address;
  if (ucp_listener_query(ls->h, &attr) == UCS_OK) bound = bound_address(address, attr.sockaddr);
  KVS_LOG_INFO("ucx: listening on {} ({})", bound, e.ctx->provider);
  return std::unique_ptr<Listener>(std::make_unique<UcxListener>(eng, std::move(ls), bound));
}

}  // namespace kvstream::transport::ucx_detail

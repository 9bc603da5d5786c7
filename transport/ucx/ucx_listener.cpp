// Connection requests queue in the listener (UCX calls the handler inside progress,
// with the engine mutex held); accept takes them and steps their handshakes side by
// side. A deadline or cancel that ends accept() leaves the handshakes it took pending:
// the next accept() goes on with them, so a connection the client is already making is
// not reset because one accept round ended (the storage node accepts in 200 ms rounds;
// on a loaded machine a setup can outlast one). A setup not finished within
// kSetupLimit is dropped.
#include "transport/ucx/ucx_listener.hpp"

#include <algorithm>
#include <deque>
#include <optional>
#include <vector>

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
    for (auto& s : setups_) abandon_establish(*eng_, s.cs, "the listener closed during connection setup");
    std::lock_guard lk(eng_->mu);
    for (auto* r : ls_->pending) ucp_listener_reject(ls_->h, r);
    ls_->pending.clear();
    ucp_listener_destroy(ls_->h);
  }

  /// Requests are taken as they come and their handshakes stepped side by side (at
  /// most kMaxSetups at once), so a peer that connects and never says hello (a hostile
  /// one, or a client that died after UCX's own connection setup) holds up none of the
  /// others. Before, one setup at a time: each such peer held the accept loop for
  /// kSetupLimit while every later client waited behind it.
  /// The caller's deadline bounds the wait for a connection, not the life of a setup
  /// already taken: a request taken from the queue is the client's only one.
  Result<std::unique_ptr<Connection>> accept(Deadline deadline, const CancelToken& cancel) override {
    for (;;) {
      // The first setup that finished is this call's connection; one that failed or
      // ran out of time is dropped, and its error returned when none finished (the
      // caller logs it).
      Status dropped;
      const auto now = Clock::now();
      for (auto it = setups_.begin(); it != setups_.end();) {
        if (!it->outcome && now < it->give_up) {
          ++it;
          continue;
        }
        Setup s = std::move(*it);
        it = setups_.erase(it);
        if (!s.outcome)
          s.outcome = peer_fault(Side::accepted, StatusCode::unavailable,
                                 "ucx: connection setup with {} did not finish in {} s", s.cs->peer,
                                 kSetupLimit.count());
        if (s.outcome->ok()) return finish_establish(eng_, s.cs, now, &cancel);  // settled: at once
        abandon_establish(*eng_, s.cs, s.outcome->message());
        if (dropped.ok()) dropped = *s.outcome;
      }
      KVS_RETURN_IF_ERROR(dropped);
      ucp_conn_request_h req = nullptr;
      KVS_RETURN_IF_ERROR(eng_->wait(
          [&]() -> std::optional<Status> {
            bool settled = false;
            for (auto& s : setups_) {
              if (!s.outcome) s.outcome = setup_outcome(*s.cs);
              settled |= s.outcome.has_value();
            }
            if (setups_.size() < kMaxSetups && !ls_->pending.empty()) {
              req = ls_->pending.front();
              ls_->pending.pop_front();
              return Status{};
            }
            const auto t = Clock::now();
            if (settled || std::any_of(setups_.begin(), setups_.end(), [&](const Setup& s) { return t >= s.give_up; }))
              return Status{};
            return std::nullopt;
          },
          deadline, &cancel, who_, "accept"));
      if (req) KVS_RETURN_IF_ERROR(take_request(req));
    }
  }

  [[nodiscard]] std::string address() const override { return addr_; }

  [[nodiscard]] std::optional<Strays> strays() const override {
    std::lock_guard lk(eng_->mu);
    return Strays{eng_->strays_dropped, eng_->stray_bytes};
  }

 private:
  static constexpr std::chrono::seconds kSetupLimit{10};
  static constexpr size_t kMaxSetups = 64;  // setups stepped at once; later requests wait

  /// A taken request's handshake.
  struct Setup {
    std::shared_ptr<ConnState> cs;
    Clock::time_point give_up;
    std::optional<Status> outcome;  // setup_outcome once it settled
  };

  /// Makes the endpoint for request `req` and sends the hello (a new Setup).
  Status take_request(ucp_conn_request_h req) {
    Engine& e = *eng_;
    std::string peer = "?";
    {
      std::lock_guard lk(e.mu);
      ucp_conn_request_attr_t attr{};
      attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
      if (ucp_conn_request_query(req, &attr) == UCS_OK) peer = format_address(attr.client_address);
    }
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    params.conn_request = req;
    KVS_ASSIGN_OR_RETURN(auto cs, begin_establish(e, params, peer, Side::accepted));
    setups_.push_back(Setup{std::move(cs), Clock::now() + kSetupLimit, std::nullopt});
    return {};
  }

  std::shared_ptr<Engine> eng_;
  std::vector<Setup> setups_;  // taken requests whose handshakes have not settled, oldest first
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

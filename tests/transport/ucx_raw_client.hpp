// A UCX client made from the engine up, below the Connection API: for the tests and
// benchmarks that play a peer kvstream's own client never is (it can reach its
// endpoint and connection state, and send under any tag). No test framework here: a
// benchmark uses it too.
#pragma once

#include <memory>
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

}  // namespace kvstream::test_ucx

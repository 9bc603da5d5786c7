// A libfabric peer below the Connection API, for the tests that play a client the
// backend would never be: kvstream's own endpoint, which says a real hello to a
// listener and then sends whatever the test wants under the connection's tags.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transport/common/address.hpp"
#include "transport/ofi/ofi_handshake.hpp"

namespace kvstream::transport::test_util {

struct RawOfiPeer {
  std::shared_ptr<ofi::Core> core;
  std::shared_ptr<ofi::Endpoint> ep;
  fi_addr_t server = FI_ADDR_UNSPEC;  // the listener, in ep's address vector
  ofi::Greeted greeted;               // the connection id it was given, and the hello's nonce
};

/// Opens an endpoint with `settings` and says hello to the listener at `address`
/// (which must be accepting meanwhile).
inline Result<RawOfiPeer> raw_ofi_peer(const LibfabricSettings& settings, const std::string& address) {
  RawOfiPeer p;
  KVS_ASSIGN_OR_RETURN(p.core, ofi::open_core(settings, false));
  std::string host;
  uint16_t port = 0;
  KVS_RETURN_IF_ERROR(parse_host_port(address, host, port));
  ofi::InfoPtr info;
  if (const int r = p.core->getinfo(host, port, 0, info); r)
    return make_status(StatusCode::unavailable, "getinfo {}: {}", address, ofi::fi_err(r));
  KVS_ASSIGN_OR_RETURN(p.ep, ofi::Endpoint::open(p.core, info.p));
  KVS_ASSIGN_OR_RETURN(p.server, p.ep->insert(info.p->dest_addr));
  KVS_ASSIGN_OR_RETURN(p.greeted, ofi::say_hello(*p.ep, p.server, address, deadline_in(std::chrono::seconds(30)), {}));
  return p;
}

}  // namespace kvstream::transport::test_util

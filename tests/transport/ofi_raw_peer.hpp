// A libfabric peer below the Connection API, for the tests that play a client the
// backend would never be: kvstream's own endpoint, which says a real hello to a
// listener and then sends whatever the test wants under the connection's tags.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>

#include <cstring>

#include "tests/transport/free_port.hpp"
#include "transport/common/address.hpp"
#include "transport/ofi/ofi_handshake.hpp"

namespace kvstream::transport::test_util {

struct RawOfiPeer {
  std::shared_ptr<ofi::Core> core;
  std::shared_ptr<ofi::Endpoint> ep;
  ofi::PeerTable::Use server_entry;   // the listener's entry in ep's address vector
  fi_addr_t server = FI_ADDR_UNSPEC;  // server_entry.addr()
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
  KVS_ASSIGN_OR_RETURN(p.server_entry, p.ep->peer(info.p->dest_addr, info.p->dest_addrlen));
  p.server = p.server_entry.addr();
  KVS_ASSIGN_OR_RETURN(p.greeted, ofi::say_hello(*p.ep, p.server, address, deadline_in(std::chrono::seconds(30)), {}));
  return p;
}

/// Sends the listener, from `p`'s endpoint and under the hello tag with connection
/// field `conn`, a hello of `magic` (kHelloMagic, or kVerifyMagic for a question) and
/// `nonce` whose address is `p`'s with a port where nothing listens: an answer to it
/// cannot be delivered. Only for providers whose names are socket addresses.
inline Status send_hello_from_nowhere(RawOfiPeer& p, uint32_t magic, uint64_t nonce, uint32_t conn) {
  KVS_ASSIGN_OR_RETURN(auto op, ofi::hello_op(*p.ep, magic, nonce));
  ofi::Hello h{};
  std::memcpy(&h, op->buf.get(), sizeof h);
  sockaddr_in in{};
  std::memcpy(&in, h.addr, sizeof in);
  in.sin_port = htons(free_port());
  std::memcpy(h.addr, &in, sizeof in);
  std::memcpy(op->buf.get(), &h, sizeof h);
  KVS_ASSIGN_OR_RETURN(void* desc, p.ep->local_desc(*op));
  KVS_RETURN_IF_ERROR(p.ep->post_send(op, op->buf.get(), sizeof h, desc, p.server,
                                      ofi::make_tag(ofi::MsgType::hello, conn), deadline_in(std::chrono::seconds(10)),
                                      {}));
  return p.ep->wait([&] { return op->done.load(); }, deadline_in(std::chrono::seconds(10)), nullptr, "hello");
}

/// A libfabric listener that keeps accepting on a thread of its own, as a node does
/// (questions about connections are answered by accept()), and the raw peers said
/// hello to it. The peers outlive the connections it made to them (the acceptor holds
/// those and is joined first): shm in one process crashed sending their bye to an
/// endpoint already closed.
class AcceptingListener {
 public:
  static Result<std::unique_ptr<AcceptingListener>> start(const BackendConfig& config) {
    auto a = std::unique_ptr<AcceptingListener>(new AcceptingListener(config));
    KVS_ASSIGN_OR_RETURN(a->backend_, create_backend(config));
    KVS_ASSIGN_OR_RETURN(a->listener_, a->backend_->listen("127.0.0.1:0"));
    a->acceptor_ = std::jthread([l = a->listener_.get(), n = &a->accepted_](std::stop_token stop) {
      std::vector<std::unique_ptr<Connection>> keep;
      while (!stop.stop_requested())
        if (auto c = l->accept(deadline_in(std::chrono::milliseconds(100)), {}); c.ok())
          keep.push_back(std::move(c).value()), ++*n;
    });
    return a;
  }

  [[nodiscard]] std::string address() const { return listener_->address(); }
  /// Connections accepted so far.
  [[nodiscard]] int accepted() const { return accepted_.load(); }
  /// Peers in the listener's address vector (Listener::peer_entries).
  [[nodiscard]] size_t peers() const { return listener_->peer_entries().value_or(0); }
  /// A new raw peer that said hello; it lives as long as this.
  Result<RawOfiPeer*> raw_peer() {
    KVS_ASSIGN_OR_RETURN(auto p, raw_ofi_peer(config_.libfabric, address()));
    return &peers_.emplace_back(std::move(p));
  }
  /// Stops accepting and closes what was accepted.
  void stop() {
    acceptor_.request_stop();
    if (acceptor_.joinable()) acceptor_.join();
  }

 private:
  explicit AcceptingListener(BackendConfig config) : config_(std::move(config)) {}
  BackendConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Listener> listener_;
  std::deque<RawOfiPeer> peers_;  // declared before the acceptor: destroyed after it
  std::atomic<int> accepted_{0};
  std::jthread acceptor_;
};

}  // namespace kvstream::transport::test_util

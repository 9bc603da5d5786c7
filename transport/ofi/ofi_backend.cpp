// The libfabric backend: the factory, its capabilities, connect, and the cached
// registrations. See ofi_backend.hpp for the design.
#include "transport/ofi/ofi_backend.hpp"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/log.hpp"
#include "transport/common/address.hpp"
#include "transport/common/registration.hpp"
#include "transport/ofi/ofi_handshake.hpp"
#include "transport/ofi/ofi_listener.hpp"
#include "transport/ofi/ofi_rma.hpp"

namespace kvstream::transport {
namespace ofi {
namespace {

class OfiBackend final : public Backend {
 public:
  explicit OfiBackend(std::shared_ptr<Core> core) : core_(std::move(core)) {
    caps_.backend = "libfabric";
    caps_.provider = core_->provider;
    caps_.host_memory = true;
    caps_.cuda_memory = core_->hmem;
    caps_.one_sided_read = core_->rma;  // FI_RMA reads (MemoryRegion::expose + Connection::read)
    caps_.notifications = false;
    caps_.max_message_bytes = std::min<uint64_t>(uint64_t(core_->segment) * Tag::kSegMask, uint64_t(1) << 40);
  }

  const Capabilities& capabilities() const override { return caps_; }

  Result<std::unique_ptr<Listener>> listen(const std::string& address) override {
    return listen_on(core_, address);
  }

  Result<std::unique_ptr<Connection>> connect(const std::string& address, Deadline deadline,
                                              const CancelToken& cancel) override {
    std::string host;
    uint16_t port = 0;
    KVS_RETURN_IF_ERROR(parse_host_port(address, host, port));
    InfoPtr info;
    const int r = core_->getinfo(host, port, 0, info);
    if (r || !info.p->dest_addr)
      return make_status(StatusCode::unavailable, "libfabric: cannot resolve {} with {}: {}", address,
                         core_->provider, fi_err(r ? r : -FI_EADDRNOTAVAIL));
    KVS_ASSIGN_OR_RETURN(auto ep, client_endpoint(info.p));
    KVS_ASSIGN_OR_RETURN(PeerTable::Use server, ep->peer(info.p->dest_addr, info.p->dest_addrlen));
    const auto listener = ListenerCheck::of(core_->provider, info.p->dest_addr, info.p->dest_addrlen, address);
    KVS_ASSIGN_OR_RETURN(Greeted g, say_hello(*ep, server.addr(), address, deadline, cancel,
                                              listener ? &*listener : nullptr));
    auto conn = std::make_unique<OfiConnection>(ep, std::move(server), g.id, fmt::format("{}:{}", host, port),
                                                 Side::connected, std::move(g.hold));
    KVS_RETURN_IF_ERROR(conn->start());
    if (core_->peer_timeout.count() > 0) conn->probe_peer(g.nonce, core_->peer_timeout, listener, g.answers_questions);
    KVS_LOG_DEBUG("libfabric: connected to {} as connection {}", address, g.id);
    return std::unique_ptr<Connection>(std::move(conn));
  }

  Result<MemoryRegion> register_memory(void* data, size_t size, MemoryType type) override {
    if (!data || size == 0)
      return make_status(StatusCode::invalid_argument, "libfabric: cannot register an empty or null buffer");
    if (type == MemoryType::cuda && !core_->hmem)
      return make_status(StatusCode::unsupported,
                         "libfabric: provider {} has no FI_HMEM support, so cuda memory cannot be registered",
                         core_->provider);
    if (auto hit = cache_.find(data, size, type)) return RegionAccess::wrap(hit);
    KVS_ASSIGN_OR_RETURN(auto region, register_region(core_, data, size, type));
    cache_.insert(region);
    return RegionAccess::wrap(std::move(region));
  }

 private:
  /// The endpoint for a connection to `info`'s destination. Where reads are staged (an
  /// interrupted read never needs its endpoint closed: Core::staged_reads) and receives
  /// name their source (Core::directed_recv), the connections from one local address
  /// share one endpoint: ofi_rxm's buffer pools, about 100 MB resident an endpoint at
  /// its default eager size, are then paid once and not per connection. Elsewhere
  /// each connection opens its own.
  Result<std::shared_ptr<Endpoint>> client_endpoint(fi_info* info) {
    if (!core_->staged_reads || !core_->directed_recv) return Endpoint::open(core_, info);
    const std::string local = info->src_addr
                                  ? std::string(static_cast<const char*>(info->src_addr), info->src_addrlen)
                                  : std::string();
    std::lock_guard lock(client_eps_mu_);
    std::erase_if(client_eps_, [](const auto& e) { return e.second.expired(); });
    if (auto it = client_eps_.find(local); it != client_eps_.end())
      if (auto ep = it->second.lock()) return ep;
    KVS_ASSIGN_OR_RETURN(auto ep, Endpoint::open(core_, info, /*shared=*/true));
    client_eps_[local] = ep;
    return ep;
  }

  std::shared_ptr<Core> core_;
  Capabilities caps_;
  std::mutex client_eps_mu_;
  std::map<std::string, std::weak_ptr<Endpoint>> client_eps_;  // by local address; alive while connections use them
  RegistrationCache cache_;
};

}  // namespace
}  // namespace ofi

Result<std::unique_ptr<Backend>> make_ofi_backend(const BackendConfig& config) {
  KVS_ASSIGN_OR_RETURN(auto core, ofi::open_core(config.libfabric, config.memory == MemoryType::cuda));
  return std::unique_ptr<Backend>(std::make_unique<ofi::OfiBackend>(std::move(core)));
}

}  // namespace kvstream::transport

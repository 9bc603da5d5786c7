// UCX (UCP) transport backend: the factory and the Backend that hands out
// connections, listeners and registrations. Its parts, one concept each:
//   ucx_wire.hpp        tags, the message prefix, the hello (what goes on the wire)
//   ucx_request.hpp     one UCX request we wait for (Op) and its post parameters
//   ucx_context.*       the UCP context from UcxSettings, memory types
//   ucx_engine.*        the worker, its progress, the wait policy, the background thread
//   ucx_staging.cpp     receiving bodies nobody asked for yet
//   ucx_strays.*        dropping messages no receive will take
//   ucx_connection.*    per-connection state and teardown
//   ucx_send.cpp        post_send / wait_sends
//   ucx_receive.cpp     header ring, post_recv, recv_header / recv_body
//   ucx_rkey.*          registration, packed keys, one-sided reads
//   ucx_handshake.cpp   endpoints, rx ids, the hello exchange
//   ucx_listener.*      accepting connections
#include <sys/socket.h>

#include "transport/backends.hpp"
#include "transport/common/address.hpp"
#include "transport/ucx/ucx_connection.hpp"
#include "transport/ucx/ucx_listener.hpp"
#include "transport/ucx/ucx_rkey.hpp"

namespace kvstream::transport {
namespace ucx_detail {
namespace {

class UcxBackend final : public Backend {
 public:
  explicit UcxBackend(std::shared_ptr<Engine> eng) : eng_(std::move(eng)) {
    caps_.backend = "ucx";
    caps_.provider = eng_->ctx->provider;
    caps_.host_memory = true;
    caps_.cuda_memory = eng_->ctx->cuda;
    caps_.one_sided_read = true;  // rkey gets: MemoryRegion::expose + Connection::read
    caps_.notifications = false;
    caps_.max_message_bytes = uint64_t(1) << 40;
  }

  [[nodiscard]] const Capabilities& capabilities() const override { return caps_; }

  Result<std::unique_ptr<Listener>> listen(const std::string& address) override { return listen_on(eng_, address); }

  Result<std::unique_ptr<Connection>> connect(const std::string& address, Deadline deadline,
                                              const CancelToken& cancel) override {
    KVS_ASSIGN_OR_RETURN(auto addrs, resolve_address("ucx", address, false));
    const sockaddr_storage& ss = addrs.front();
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
    params.sockaddr.addrlen = sockaddr_len(ss);
    return establish(eng_, params, address, deadline, &cancel);
  }

  Result<MemoryRegion> register_memory(void* data, size_t size, MemoryType type) override {
    return register_region(*eng_, data, size, type);
  }

 private:
  std::shared_ptr<Engine> eng_;
  Capabilities caps_;
};

}  // namespace
}  // namespace ucx_detail

Result<std::unique_ptr<Backend>> make_ucx_backend(const BackendConfig& config) {
  KVS_ASSIGN_OR_RETURN(auto eng, ucx_detail::Engine::create(config));
  return std::unique_ptr<Backend>(std::make_unique<ucx_detail::UcxBackend>(std::move(eng)));
}

}  // namespace kvstream::transport

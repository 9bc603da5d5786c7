// The tcp transport backend: framed messages over TCP (tcp_framing.hpp,
// docs/wire-tcp.md), driven by io_uring. This file has the backend itself: the
// kernel probe, capabilities and registration; connections are tcp_connection.hpp,
// the listener tcp_listener.hpp, the rings and their waits tcp_ring.hpp.
#include <liburing.h>

#include <memory>
#include <string>

#include "core/log.hpp"
#include "transport/backends.hpp"
#include "transport/common/registration.hpp"
#include "transport/tcp/tcp_connection.hpp"
#include "transport/tcp/tcp_framing.hpp"
#include "transport/tcp/tcp_listener.hpp"
#include "transport/tcp/tcp_ring.hpp"

namespace kvstream::transport {
namespace tcp {
namespace {

/// A tcp registration only records the range: sends and receives use ordinary
/// (non-fixed) io_uring buffers, so there is no kernel handle to release.
struct TcpRegion final : MemoryRegion::Impl {};

/// Opens listeners and connections with the settings the probe allowed.
class TcpBackend final : public Backend {
 public:
  TcpBackend(const BackendConfig& config, const TcpSettings& opt,
             std::shared_ptr<const security::TlsContext> client_tls)
      : opt_(opt), depth_(config.tcp.queue_depth), client_tls_(std::move(client_tls)) {
    caps_.backend = "tcp";
    caps_.provider = opt.tls.enabled ? "io_uring, TLS 1.3" : "io_uring";
    caps_.host_memory = true;
    caps_.cuda_memory = false;
    caps_.one_sided_read = false;
    caps_.notifications = false;
    caps_.max_message_bytes = kTcpMaxBodyBytes;
  }

  [[nodiscard]] const Capabilities& capabilities() const override { return caps_; }

  Result<std::unique_ptr<Listener>> listen(const std::string& address) override {
    std::shared_ptr<const security::TlsContext> tls;
    if (opt_.tls.enabled) {
      // Made per listener: only a listening side needs a certificate.
      KVS_ASSIGN_OR_RETURN(tls, security::TlsContext::create(opt_.tls, security::TlsRole::server));
    }
    return listen_tcp(address, opt_, depth_, std::move(tls));
  }

  Result<std::unique_ptr<Connection>> connect(const std::string& address, Deadline deadline,
                                              const CancelToken& cancel) override {
    return connect_tcp(address, opt_, depth_, client_tls_, deadline, cancel);
  }

  Result<MemoryRegion> register_memory(void* data, size_t size, MemoryType type) override {
    if (type != MemoryType::host)
      return make_status(StatusCode::unsupported, "tcp backend registers host memory only, not {} memory",
                         memory_type_name(type));
    if (data == nullptr || size == 0)
      return make_status(StatusCode::invalid_argument, "tcp register_memory: empty range (data {}, size {})", data,
                         size);
    if (auto hit = cache_.find(data, size, type)) return RegionAccess::wrap(hit);
    auto region = std::make_shared<TcpRegion>();
    region->data = static_cast<std::byte*>(data);
    region->size = size;
    region->type = type;
    cache_.insert(region);
    return RegionAccess::wrap(std::move(region));
  }

 private:
  Capabilities caps_;
  TcpSettings opt_;
  unsigned depth_;
  std::shared_ptr<const security::TlsContext> client_tls_;  ///< null in clear text
  RegistrationCache cache_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_backend(const BackendConfig& config) {
  if (config.memory != MemoryType::host)
    return make_status(StatusCode::unsupported,
                       "tcp backend moves host memory only: {} memory needs a GPUDirect-capable backend (ucx)",
                       memory_type_name(config.memory));
  if (config.tcp.queue_depth < 4 || config.tcp.queue_depth > 32768)
    return make_status(StatusCode::invalid_argument, "tcp.queue_depth {} is outside [4, 32768]",
                       config.tcp.queue_depth);
  TcpSettings opt = config.tcp;
  {
    // Probe io_uring once (it may be disabled by sysctl or seccomp) and the opcodes used.
    Ring probe_ring;
    KVS_RETURN_IF_ERROR(probe_ring.init(4));
    io_uring_probe* probe = io_uring_get_probe_ring(probe_ring.get());
    if (!probe) return make_status(StatusCode::unavailable, "tcp: io_uring opcode probe failed");
    const bool basic = io_uring_opcode_supported(probe, IORING_OP_SENDMSG) &&
                       io_uring_opcode_supported(probe, IORING_OP_RECV) &&
                       io_uring_opcode_supported(probe, IORING_OP_ACCEPT) &&
                       io_uring_opcode_supported(probe, IORING_OP_CONNECT) &&
                       io_uring_opcode_supported(probe, IORING_OP_ASYNC_CANCEL);
    const bool zc = io_uring_opcode_supported(probe, IORING_OP_SENDMSG_ZC);
    io_uring_free_probe(probe);
    if (!basic) return make_status(StatusCode::unavailable, "tcp: this kernel's io_uring lacks socket opcodes");
    if (opt.send_zc && !zc) {
      KVS_LOG_WARN("tcp: IORING_OP_SENDMSG_ZC is not supported by this kernel; using plain sends");
      opt.send_zc = false;
    }
  }
  std::shared_ptr<const security::TlsContext> client_tls;
  if (opt.tls.enabled) {
    // The client's context is made here, so bad paths or trust fail at creation.
    KVS_ASSIGN_OR_RETURN(client_tls, security::TlsContext::create(opt.tls, security::TlsRole::client));
    if (opt.send_zc) {
      KVS_LOG_INFO("tcp: send_zc is ignored with TLS (records are encrypted before they are sent)");
      opt.send_zc = false;
    }
  }
  return std::unique_ptr<Backend>(std::make_unique<TcpBackend>(config, opt, std::move(client_tls)));
}

}  // namespace tcp

Result<std::unique_ptr<Backend>> make_tcp_backend(const BackendConfig& config) {
  return tcp::make_backend(config);
}

}  // namespace kvstream::transport

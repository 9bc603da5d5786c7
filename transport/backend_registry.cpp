// Which backends this build has, and the one place that creates them.
#include <fmt/ranges.h>

#include "core/log.hpp"
#include "transport/backends.hpp"

namespace kvstream::transport {

std::vector<std::string> available_backends() {
  std::vector<std::string> v;
#if KVSTREAM_HAVE_URING
  v.push_back("tcp");
#endif
#if KVSTREAM_HAVE_UCX
  v.push_back("ucx");
#endif
#if KVSTREAM_HAVE_LIBFABRIC
  v.push_back("libfabric");
#endif
  return v;
}

Result<std::unique_ptr<Backend>> create_backend(const BackendConfig& config) {
  // Failing loudly: a config asking for TLS must never get a clear connection.
  if (config.tcp.tls.enabled && config.name != "tcp")
    return make_status(StatusCode::unsupported,
                       "TLS (tcp.tls.enabled) is built for the tcp backend only; backend '{}' moves bytes in clear "
                       "(run it on a trusted fabric, or use tcp)",
                       config.name);
  Result<std::unique_ptr<Backend>> r = make_status(
      StatusCode::unsupported, "transport backend '{}' is not built into this kvstream (available: {})", config.name,
      fmt::join(available_backends(), ", "));
#if KVSTREAM_HAVE_URING
  if (config.name == "tcp") r = make_tcp_backend(config);
#endif
#if KVSTREAM_HAVE_UCX
  if (config.name == "ucx") r = make_ucx_backend(config);
#endif
#if KVSTREAM_HAVE_LIBFABRIC
  if (config.name == "libfabric") r = make_ofi_backend(config);
#endif
  if (!r.ok()) return r.status();
  const Capabilities& c = (*r)->capabilities();
  KVS_LOG_INFO("transport: backend {} over {}, {} memory, one-sided reads {}", c.backend, c.provider,
               memory_type_name(config.memory), c.one_sided_read ? "yes" : "no");
  return r;
}

}  // namespace kvstream::transport

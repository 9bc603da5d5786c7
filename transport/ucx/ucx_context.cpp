// Error mode: endpoints use UCP_ERR_HANDLING_MODE_PEER (peer failure is detected).
// UCX 1.13 then leaves cma out; with the get_zcopy rendezvous scheme (set unless
// UCX_TLS is tcp alone) large shm messages go through the sysv FIFO (two copies) at
// 2-12 GB/s on the 2-vCPU VM, whole runs slow or fast, as ucx_perftest -e's do.
// UcxSettings::peer_errors = false trades failure detection (a dead peer may then
// surface only as a timeout) for cma.
#include "transport/ucx/ucx_context.hpp"

#include <cstdlib>

#include "core/log.hpp"

namespace kvstream::transport::ucx_detail {
namespace {

struct ConfigRelease {
  void operator()(ucp_config_t* c) const { ucp_config_release(c); }
};
using ConfigPtr = std::unique_ptr<ucp_config_t, ConfigRelease>;

/// Tunes UCX for endpoints with peer error handling unless the environment says otherwise.
void tune_for_peer_errors(ucp_config_t* cfg, const UcxSettings& settings) {
  // UCX 1.13 leaves the shared memory transports out of PEER-mode endpoints unless
  // MM_ERROR_HANDLING is on (UCX issue #8477). A tcp-only UCX has no shared memory
  // (and warns about the setting): left alone.
  std::string tls = settings.tls;
  if (tls.empty())
    if (const char* env = std::getenv("UCX_TLS")) tls = env;
  const bool tcp_only = tls == "tcp";
  if (settings.peer_errors && !tcp_only && !std::getenv("UCX_MM_ERROR_HANDLING") &&
      ucp_config_modify(cfg, "MM_ERROR_HANDLING", "y") != UCS_OK)
    KVS_LOG_DEBUG("ucx: MM_ERROR_HANDLING is not a setting of this UCX");
  // Rendezvous: with peer error handling UCX 1.13 keeps cma out, and its default
  // scheme then adds a tcp lane for large shared-memory messages (~5 GB/s here, and
  // an epoll_wait in every progress call: 3.5 us round trips instead of 1.0).
  // get_zcopy keeps such endpoints on shared memory alone (~10 GB/s, 1.0 us). Over
  // tcp alone it is slower (3.4 vs 4.4 GB/s), so a tcp-only UCX keeps the default.
  // UCX_RNDV_SCHEME in the environment wins.
  if (!tcp_only && !std::getenv("UCX_RNDV_SCHEME") && ucp_config_modify(cfg, "RNDV_SCHEME", "get_zcopy") != UCS_OK)
    KVS_LOG_DEBUG("ucx: RNDV_SCHEME is not a setting of this UCX");
}

/// Lets a listener bind its port while connections of an earlier listener on it linger
/// in TIME_WAIT (the side that closes first keeps them a minute; a node that was killed
/// or stopped is that side), as the tcp backend does with SO_REUSEADDR: otherwise a
/// restarted node is refused its own port ("Device is busy") for that minute. The
/// connection managers' setting (CM_REUSEADDR; UCX 1.13 takes no per-manager name
/// here); the environment's wins.
void reuse_listener_addresses(ucp_config_t* cfg) {
  if (std::getenv("UCX_CM_REUSEADDR") || std::getenv("UCX_TCP_CM_REUSEADDR")) return;
  if (ucp_config_modify(cfg, "CM_REUSEADDR", "y") != UCS_OK)
    KVS_LOG_DEBUG("ucx: CM_REUSEADDR is not a setting of this UCX");
}

}  // namespace

Result<std::shared_ptr<Context>> Context::create(const UcxSettings& settings, MemoryType memory) {
  auto ctx = std::make_shared<Context>();
  ucp_config_t* raw = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &raw);
  if (st != UCS_OK) return make_status(StatusCode::unavailable, "ucx: ucp_config_read: {}", ucs_status_string(st));
  const ConfigPtr cfg(raw);
  if (!settings.tls.empty()) {
    st = ucp_config_modify(cfg.get(), "TLS", settings.tls.c_str());
    if (st != UCS_OK)
      return make_status(StatusCode::invalid_argument, "ucx: bad ucx_tls '{}': {}", settings.tls,
                         ucs_status_string(st));
    ctx->provider = "UCX_TLS=" + settings.tls;
  } else if (const char* env = std::getenv("UCX_TLS"); env && *env) {
    ctx->provider = std::string("UCX_TLS=") + env;
  } else {
    ctx->provider = "UCX default";
  }
  tune_for_peer_errors(cfg.get(), settings);
  reuse_listener_addresses(cfg.get());
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, cfg.get(), &ctx->h);
  if (st != UCS_OK) {
    ctx->h = nullptr;
    return make_status(StatusCode::unavailable, "ucx: ucp_init ({}): {}", ctx->provider, ucs_status_string(st));
  }
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(ctx->h, &attr) == UCS_OK) ctx->cuda = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  if (memory == MemoryType::cuda && !ctx->cuda)
    return make_status(StatusCode::unsupported,
                       "ucx: cuda memory requested but this UCX ({}) has no cuda transport (no cuda memory type)",
                       ctx->provider);
  return ctx;
}

}  // namespace kvstream::transport::ucx_detail

// Provider selection and the fabric and domain: see ofi_fabric.hpp.
#include "transport/ofi/ofi_fabric.hpp"

#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace kvstream::transport::ofi {
namespace {

fi_info* make_hints(const std::string& provider, bool rma, bool hmem, bool directed) {
  fi_info* h = fi_allocinfo();
  if (!h) return nullptr;
  h->ep_attr->type = FI_EP_RDM;
  h->caps = FI_TAGGED | FI_MSG | (rma ? FI_RMA | FI_READ | FI_REMOTE_READ : 0) | (hmem ? FI_HMEM : 0) |
            (directed ? FI_DIRECTED_RECV : 0);
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
                            (hmem ? FI_MR_HMEM : 0);
  h->domain_attr->threading = FI_THREAD_SAFE;
  h->domain_attr->data_progress = FI_PROGRESS_UNSPEC;
  h->fabric_attr->prov_name = strdup(provider.c_str());
  return h;
}

/// After no provider matched with cuda: is it the provider or its cuda path that is
/// missing? The error to return.
Status no_provider(const std::string& provider, bool want_cuda, int err) {
  if (want_cuda) {
    fi_info* plain = make_hints(provider, false, false, false);
    fi_info* probe = nullptr;
    const int pr = plain ? fi_getinfo(kFiVersion, nullptr, nullptr, 0, plain, &probe) : -FI_ENOMEM;
    if (probe) fi_freeinfo(probe);
    if (plain) fi_freeinfo(plain);
    if (pr == 0)
      return make_status(StatusCode::unsupported,
                         "libfabric: provider '{}' has no FI_HMEM support, so bodies in cuda memory "
                         "(GPUDirect) are not available",
                         provider);
  }
  return make_status(StatusCode::unavailable, "libfabric: no provider '{}' offers RDM tagged messages here: {}",
                     provider, fi_err(err));
}

}  // namespace

std::string fi_err(int err) { return fmt::format("{} ({})", fi_strerror(err < 0 ? -err : err), err < 0 ? -err : err); }

Core::~Core() {
  if (domain) fi_close(&domain->fid);
  if (fabric) fi_close(&fabric->fid);
  if (info) fi_freeinfo(info);
  if (hints) fi_freeinfo(hints);
}

int Core::getinfo(const std::string& host, uint16_t port, uint64_t flags, InfoPtr& out) const {
  const std::string service = std::to_string(port);
  return fi_getinfo(kFiVersion, host.c_str(), service.c_str(), flags, hints, &out.p);
}

bool Core::sockaddr_names() const {
  return info->addr_format == FI_SOCKADDR_IN || info->addr_format == FI_SOCKADDR_IN6 ||
         info->addr_format == FI_SOCKADDR;
}

Result<std::shared_ptr<Core>> open_core(const LibfabricSettings& settings, bool want_cuda) {
  auto core = std::make_shared<Core>();
  fi_info* got = nullptr;
  // Prefer RMA reads (a declared capability), then receives directed to their source
  // (client connections then share an endpoint); fall back to plain tagged messages.
  int r = 0;
  for (bool rma : {true, false}) {
    for (bool directed : {true, false}) {
      fi_info* hints = make_hints(settings.provider, rma, want_cuda, directed);
      if (!hints) return make_status(StatusCode::resource_exhausted, "libfabric: fi_allocinfo failed");
      r = fi_getinfo(kFiVersion, nullptr, nullptr, 0, hints, &got);
      if (r == 0 && got) {
        core->hints = hints;
        core->rma = rma;
        core->directed_recv = directed;
        break;
      }
      fi_freeinfo(hints);
      got = nullptr;
    }
    if (got) break;
  }
  if (!got) return no_provider(settings.provider, want_cuda, r);
  // The fabric and domain of the first match; listen/connect reuse the same hints.
  core->info = got;
  core->peer_timeout = settings.peer_timeout;
  core->provider = got->fabric_attr->prov_name ? got->fabric_attr->prov_name : settings.provider;
  core->mr_local = (got->domain_attr->mr_mode & FI_MR_LOCAL) || (got->mode & FI_LOCAL_MR);
  core->mr_prov_key = got->domain_attr->mr_mode & FI_MR_PROV_KEY;
  core->mr_virt_addr = got->domain_attr->mr_mode & FI_MR_VIRT_ADDR;
  core->hmem = want_cuda && (got->caps & FI_HMEM);
  core->rma = core->rma && (got->caps & FI_RMA) && (got->caps & FI_READ);
  core->staged_reads = core->provider.find("ofi_rxm") != std::string::npos;
  core->cleared_bodies = core->staged_reads;
  core->inject = std::min<size_t>(got->tx_attr->inject_size, 4096);
  core->segment = std::min<size_t>(got->ep_attr->max_msg_size ? got->ep_attr->max_msg_size : kMaxSegmentBytes,
                                   kMaxSegmentBytes);
  if (got->domain_attr->mr_mode & FI_MR_ENDPOINT)
    return make_status(StatusCode::unsupported,
                       "libfabric: provider '{}' needs FI_MR_ENDPOINT registrations, which this backend lacks",
                       core->provider);
  // Pin the provider name we got, so listen/connect resolve the same one.
  free(core->hints->fabric_attr->prov_name);
  core->hints->fabric_attr->prov_name = strdup(core->provider.c_str());
  core->hints->domain_attr->mr_mode = got->domain_attr->mr_mode;
  r = fi_fabric(got->fabric_attr, &core->fabric, nullptr);
  if (r) return make_status(StatusCode::unavailable, "libfabric: fi_fabric({}): {}", core->provider, fi_err(r));
  r = fi_domain(core->fabric, got, &core->domain, nullptr);
  if (r) return make_status(StatusCode::unavailable, "libfabric: fi_domain({}): {}", core->provider, fi_err(r));
  return core;
}

}  // namespace kvstream::transport::ofi

// The libfabric backend's core: the provider chosen from LibfabricSettings (and what
// it grants: RMA reads, cuda memory, registration modes, sizes), its fabric and
// domain, and the table of registrations that gives local descriptors.
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kvstream/transport_config.hpp"
#include "transport/ofi/ofi_wire.hpp"

namespace kvstream::transport::ofi {

inline constexpr uint32_t kFiVersion = FI_VERSION(1, 17);

/// "No such device (19)" for an FI_E* value of either sign.
std::string fi_err(int err);

/// Owns an fi_info list.
struct InfoPtr {
  fi_info* p = nullptr;
  InfoPtr() = default;
  InfoPtr(const InfoPtr&) = delete;
  InfoPtr& operator=(const InfoPtr&) = delete;
  ~InfoPtr() {
    if (p) fi_freeinfo(p);
  }
};

struct OfiRegion;

struct Core {
  fi_info* hints = nullptr;  // what every fi_getinfo asks for (provider fixed)
  fi_info* info = nullptr;   // the one the domain was opened with
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  std::string provider;
  bool mr_local = false, mr_prov_key = false, mr_virt_addr = false, rma = false, hmem = false;
  size_t segment = kMaxSegmentBytes;
  /// Reads land in internal buffers and are copied out (ofi_rma.cpp): for ofi_rxm,
  /// whose fi_close of an endpoint with an RMA read in flight crashed in libfabric
  /// 1.17 (SIGSEGV in about 1 of 15 reads interrupted by their deadline), so an
  /// interrupted read must not close the endpoint under it.
  bool staged_reads = false;
  /// ofi_rxm: a body larger than `inject` is sent only once its receiver has posted
  /// the receives for it and said so (MsgType::clear), and a receive is never posted
  /// over a queued message it should not take. ofi_rxm 1.17 keeps a large (rendezvous
  /// or segmented) message queued after its sender's connection closed, and a receive
  /// that matches it then reads through the closed connection and crashes the process:
  /// a body that arrives only after its receive was posted is matched while its
  /// sender's connection is open.
  bool cleared_bodies = false;
  /// Receives can name their source (FI_DIRECTED_RECV): a client's connections to
  /// different listeners, whose connection ids may be equal, can share an endpoint.
  bool directed_recv = false;
  size_t inject = 0;
  /// LibfabricSettings::peer_timeout (0: connections do not probe their peers).
  std::chrono::milliseconds peer_timeout{0};
  std::atomic<uint64_t> next_key{1};

  std::mutex regions_mu;
  std::map<uintptr_t, OfiRegion*> regions;  // by start address, for descriptors

  Core() = default;
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;
  ~Core();

  /// fi_getinfo for host:port with the pinned hints (`flags`: FI_SOURCE for a local
  /// address). 0 or a negative FI_E* value.
  int getinfo(const std::string& host, uint16_t port, uint64_t flags, InfoPtr& out) const;

  /// Whether endpoint names are socket addresses (tcp;ofi_rxm), so a listener bound
  /// to port 0 learns its port from fi_getname; shm's are names ("fi_ns://...").
  bool sockaddr_names() const;

  /// Whether the provider is shm (endpoint names it keeps per process: ofi_shm_local.hpp).
  bool shm() const { return provider == "shm"; }

  /// The local descriptor of registered memory covering [p, p + n), or null
  /// (defined with the registrations, in ofi_rma.cpp).
  void* desc_for(const void* p, size_t n);
};

/// Chooses the provider `settings` names, preferring one with RMA reads, with
/// FI_HMEM when `want_cuda`, and opens its fabric and domain. Errors: unsupported
/// (no cuda path, FI_MR_ENDPOINT), unavailable (no such provider here).
Result<std::shared_ptr<Core>> open_core(const LibfabricSettings& settings, bool want_cuda);

}  // namespace kvstream::transport::ofi

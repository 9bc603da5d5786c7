// Registrations, remote keys and one-sided reads (where the provider grants FI_RMA and
// FI_READ: tcp;ofi_rxm and shm here, verbs/efa elsewhere). MemoryRegion::expose packs
// fi_mr_key and the domain's addressing mode; Connection::read posts fi_read segments
// straight into the caller's registered buffer, except on ofi_rxm (Core::staged_reads),
// where they land in the connection's staging buffer and are copied out. libfabric
// cannot cancel an RMA read: a direct one that is interrupted is given 20 ms to finish
// and then a client's endpoint (one per connection) is closed under it, so nothing
// lands in the caller's buffer after read returns (an accepted connection shares the
// listener's endpoint and can only log that case); a staged one leaves the endpoint
// open, its late data landing in the staging buffer its operations keep alive.
#include "transport/ofi/ofi_rma.hpp"

#include <rdma/fi_domain.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>

#include "core/log.hpp"
#include "transport/ofi/ofi_connection.hpp"

namespace kvstream::transport::ofi {

using namespace std::chrono_literals;

struct OfiRegion final : MemoryRegion::Impl {
  std::shared_ptr<Core> core;
  fid_mr* mr = nullptr;

  Result<std::vector<std::byte>> packed_key() const override {
    if (!core->rma)
      return make_status(StatusCode::unsupported, "libfabric: provider {} has no FI_RMA reads", core->provider);
    const uint64_t key = fi_mr_key(mr);
    if (key == FI_KEY_NOTAVAIL)
      return make_status(StatusCode::unsupported, "libfabric: provider {} gives no key for this region",
                         core->provider);
    std::vector<std::byte> out(kRemoteKeyBytes);
    std::memcpy(out.data(), &key, sizeof key);
    out[8] = std::byte{core->mr_virt_addr ? uint8_t(1) : uint8_t(0)};
    return out;
  }

  ~OfiRegion() override {
    {
      std::lock_guard lock(core->regions_mu);
      auto it = core->regions.find(reinterpret_cast<uintptr_t>(data));
      if (it != core->regions.end() && it->second == this) core->regions.erase(it);
    }
    if (mr) fi_close(&mr->fid);
  }
};

void* Core::desc_for(const void* p, size_t n) {
  std::lock_guard lock(regions_mu);
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = regions.upper_bound(a);
  if (it == regions.begin()) return nullptr;
  --it;
  OfiRegion* r = it->second;
  if (a + n > it->first + r->size || !r->mr) return nullptr;
  return fi_mr_desc(r->mr);
}

Result<std::shared_ptr<MemoryRegion::Impl>> register_region(const std::shared_ptr<Core>& core, void* data,
                                                             size_t size, MemoryType type) {
  auto region = std::make_shared<OfiRegion>();
  region->core = core;
  region->data = static_cast<std::byte*>(data);
  region->size = size;
  region->type = type;
  uint64_t access = FI_SEND | FI_RECV;
  if (core->rma) access |= FI_READ | FI_REMOTE_READ;
  iovec iov{data, size};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = access;
  attr.requested_key = core->next_key.fetch_add(1);
  attr.iface = type == MemoryType::cuda ? FI_HMEM_CUDA : FI_HMEM_SYSTEM;
  int r = fi_mr_regattr(core->domain, &attr, 0, &region->mr);
  if (r) {
    region->mr = nullptr;
    return make_status(StatusCode::resource_exhausted, "libfabric: fi_mr_reg of {} bytes failed: {}", size,
                       fi_err(r));
  }
  {
    std::lock_guard lock(core->regions_mu);
    core->regions[reinterpret_cast<uintptr_t>(data)] = region.get();
  }
  return std::shared_ptr<MemoryRegion::Impl>(std::move(region));
}

Status OfiConnection::read(std::span<std::byte> dest, const RemoteRegion& src, uint64_t offset, Deadline deadline,
                           const CancelToken& cancel) {
  Core& core = ep_->core();
  if (!core.rma)
    return make_status(StatusCode::unsupported, "libfabric: provider {} has no FI_RMA reads", core.provider);
  if (offset > src.size || dest.size() > src.size - offset)
    return make_status(StatusCode::out_of_range, "libfabric: read of {} bytes at {} of a {}-byte remote region",
                       dest.size(), offset, src.size);
  if (dest.empty()) return {};
  if (cancel.cancelled()) return make_status(StatusCode::cancelled, "libfabric: read cancelled");
  if (src.key.size() != kRemoteKeyBytes || uint8_t(src.key[8]) > 1)
    return make_status(StatusCode::invalid_argument, "libfabric: a remote key from {} is malformed ({} bytes)",
                       peer_name_, src.key.size());
  if ((uint8_t(src.key[8]) == 1) != core.mr_virt_addr)
    return make_status(StatusCode::invalid_argument,
                       "libfabric: a remote key from {} addresses its region {}, this domain {}", peer_name_,
                       uint8_t(src.key[8]) ? "by virtual address" : "by offset",
                       core.mr_virt_addr ? "by virtual address" : "by offset");
  if (peer_lost_.load()) return peer_lost_status();
  if (!broken_.empty()) return detail::repeated_status(StatusCode::unavailable, "libfabric: {}", broken_);
  if (shared_->bye.load())
    return make_status(StatusCode::unavailable, "libfabric: peer {} closed the connection", peer_name_);
  uint64_t key = 0;
  std::memcpy(&key, src.key.data(), sizeof key);
  void* desc = core.desc_for(dest.data(), dest.size());
  if (!desc && core.mr_local)
    return make_status(StatusCode::invalid_argument,
                       "libfabric: read destination is not registered with this backend (provider needs FI_MR_LOCAL)");
  // With FI_MR_VIRT_ADDR the target address is the owner's virtual address, else the
  // offset into the registration.
  const uint64_t base = (core.mr_virt_addr ? src.address : 0) + offset;
  // Staged: the segments land in the connection's staging buffer and are copied out
  // once all have, so an interrupted read leaves the endpoint open (no fi_close under
  // it) and can never write into `dest` after we return. (Segments stay whole: split
  // into 4 MiB pieces, ofi_rxm read 16 MiB at 0.07 GB/s instead of 1 GB/s.)
  const bool staged = core.staged_reads;
  const size_t seg = core.segment;
  const size_t nseg = (dest.size() + seg - 1) / seg;
  std::vector<std::shared_ptr<Op>> ops;
  ops.reserve(nseg);
  auto all_done = [&] {
    for (auto& o : ops)
      if (!o->done.load(std::memory_order_acquire)) return false;
    return true;
  };
  Status st;
  std::byte* into = dest.data();
  std::shared_ptr<Staging> stage;
  if (staged) {
    // Reused while no interrupted read still holds it (then that read's operations
    // keep it, and this connection is broken anyway).
    {
      std::lock_guard lock(staging_mu_);
      if (!staging_ || staging_.use_count() > 1 || staging_->size < dest.size()) {
        KVS_ASSIGN_OR_RETURN(staging_, ep_->new_staging(dest.size()));
      }
      stage = staging_;
    }
    into = stage->buf.get();
    desc = stage->mr ? fi_mr_desc(stage->mr) : nullptr;
  }
  for (size_t i = 0; i < nseg && st.ok(); ++i) {
    const size_t off = i * seg, len = std::min(seg, dest.size() - off);
    auto op = ep_->new_op();
    if (staged) op->keep = stage;
    st = ep_->post_read(op, into + off, len, desc, peer_.addr(), base + off, key, deadline, cancel);
    if (st.ok()) ops.push_back(std::move(op));
  }
  if (st.ok())
    st = wait_on_peer([&] { return all_done() || shared_->bye.load(std::memory_order_acquire); }, deadline, cancel,
                      "read");
  if (st.ok() && !all_done())
    st = make_status(StatusCode::unavailable, "libfabric: peer {} closed the connection during a read", peer_name_);
  if (!st.ok()) {
    // RMA reads cannot be cancelled: nothing may land in `dest` after we return, so
    // wait briefly for them, then close the endpoint (ours alone) under them; staged
    // reads land in their own buffers, which the operations keep alive (a shared
    // endpoint is one whose reads are staged: ofi_backend.cpp).
    if (!staged && !ep_->wait(all_done, deadline_in(20ms), nullptr, "read drain").ok()) {
      if (!ep_->shared()) {  // the endpoint is ours alone
        ep_->close_now();
      } else {
        KVS_LOG_ERROR("libfabric: a read into a caller's buffer from {} could not be stopped", peer_name_);
      }
    }
    broken_ = fmt::format("connection to {} unusable after an interrupted read ({})", peer_name_, st.message());
    return st;
  }
  for (auto& o : ops)
    if (o->err) {
      broken_ = fmt::format("read from {} failed: {}", peer_name_, fi_err(o->err));
      return make_status(StatusCode::unavailable, "libfabric: {}", broken_);
    }
  if (staged) std::memcpy(dest.data(), into, dest.size());
  if (probe_) probe_->heard();
  return {};
}

}  // namespace kvstream::transport::ofi

// Registration and one-sided reads: regions mapped on the context (they may outlive
// the engine, hence the context's mutex), their packed remote keys, and gets from a
// peer's exposed region with its key unpacked once per endpoint.
#include "transport/ucx/ucx_rkey.hpp"

#include "core/log.hpp"
#include "transport/ucx/ucx_connection.hpp"

namespace kvstream::transport::ucx_detail {

using namespace std::chrono_literals;

namespace {

struct UcxRegion : MemoryRegion::Impl {
  std::shared_ptr<Context> ctx;
  ucp_mem_h memh = nullptr;
  ~UcxRegion() override {
    if (!memh) return;
    std::lock_guard lk(ctx->mu);
    ucp_mem_unmap(ctx->h, memh);
  }
  Result<std::vector<std::byte>> packed_key() const override {
    void* buf = nullptr;
    size_t len = 0;
    std::lock_guard lk(ctx->mu);
    const ucs_status_t st = ucp_rkey_pack(ctx->h, memh, &buf, &len);
    if (st != UCS_OK) return make_status(StatusCode::unavailable, "ucx: ucp_rkey_pack: {}", ucs_status_string(st));
    std::vector<std::byte> key(static_cast<std::byte*>(buf), static_cast<std::byte*>(buf) + len);
    ucp_rkey_buffer_release(buf);
    return key;
  }
};

/// The peer's key `packed` unpacked on the connection's endpoint, from the
/// connection's cache where it was unpacked before. Requires mu.
Result<ucp_rkey_h> unpack_rkey_locked(ConnState& cs, std::span<const std::byte> packed) {
  std::string key(reinterpret_cast<const char*>(packed.data()), packed.size());
  if (auto it = cs.rkeys.find(key); it != cs.rkeys.end()) return it->second;
  ucp_rkey_h rkey = nullptr;
  const ucs_status_t st = ucp_ep_rkey_unpack(cs.ep, packed.data(), &rkey);
  if (st != UCS_OK)
    return make_status(StatusCode::invalid_argument, "ucx: a remote key from {} does not unpack: {}", cs.peer,
                       ucs_status_string(st));
  if (cs.rkeys.size() >= 256) destroy_rkeys_locked(cs);  // bounded: a reader of many regions
  cs.rkeys.emplace(std::move(key), rkey);
  return rkey;
}

}  // namespace

Result<MemoryRegion> register_region(Engine& e, void* data, size_t size, MemoryType type) {
  if (data == nullptr || size == 0)
    return make_status(StatusCode::invalid_argument, "ucx: cannot register an empty or null range");
  if (type == MemoryType::cuda && !e.ctx->cuda)
    return make_status(StatusCode::unsupported, "ucx: this UCX has no cuda transport; cannot register cuda memory");
  if (auto hit = e.cache.find(data, size, type)) return RegionAccess::wrap(hit);
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  p.address = data;
  p.length = size;
  p.memory_type = type == MemoryType::cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  auto r = std::make_shared<UcxRegion>();
  r->ctx = e.ctx;
  ucs_status_t st;
  {
    std::lock_guard lk(e.mu);
    st = ucp_mem_map(e.ctx->h, &p, &r->memh);
  }
  if (st != UCS_OK) {
    r->memh = nullptr;
    return make_status(StatusCode::resource_exhausted, "ucx: ucp_mem_map of {} bytes: {}", size,
                       ucs_status_string(st));
  }
  r->data = static_cast<std::byte*>(data);
  r->size = size;
  r->type = type;
  e.cache.insert(r);
  return RegionAccess::wrap(r);
}

void destroy_rkeys_locked(ConnState& cs) {
  for (auto& [key, rkey] : cs.rkeys) ucp_rkey_destroy(rkey);
  cs.rkeys.clear();
}

Status UcxConnection::read(std::span<std::byte> dest, const RemoteRegion& src, uint64_t offset, Deadline deadline,
                           const CancelToken& cancel) {
  if (offset > src.size || dest.size() > src.size - offset)
    return make_status(StatusCode::out_of_range, "ucx: read of {} bytes at {} of a {}-byte remote region",
                       dest.size(), offset, src.size);
  if (dest.empty()) return {};
  if (src.key.empty()) return make_status(StatusCode::invalid_argument, "ucx: read without a remote key");
  Engine& e = *eng_;
  // On the heap: a get that never completes keeps its Op (stray_reads).
  auto op = std::make_unique<Op>();
  {
    std::lock_guard lk(e.mu);
    if (cs_->failed || !cs_->ep) return cs_->failure();
    KVS_ASSIGN_OR_RETURN(ucp_rkey_h rkey, unpack_rkey_locked(*cs_, src.key));
    op->arm();
    ucp_request_param_t p = send_param(*op);
    if (!op->track(ucp_get_nbx(cs_->ep, dest.data(), dest.size(), src.address + offset, rkey, &p)))
      return make_status(StatusCode::unavailable, "ucx: get from {} failed: {}", cs_->peer,
                         ucs_status_string(op->status));
  }
  Status s = e.wait(
      [&]() -> std::optional<Status> {
        if (op->done) return Status{};
        if (cs_->failed) return cs_->failure();
        return std::nullopt;
      },
      deadline, &cancel, cs_->who, "read");
  if (!op->done) {
    // An RMA get cannot be cancelled: close the endpoint so that it completes (with
    // an error) before we return; the connection is broken from here on.
    {
      std::lock_guard lk(e.mu);
      cs_->fail(fmt::format("connection to {} unusable after an interrupted read ({})", cs_->peer,
                            s.ok() ? std::string("peer failed") : s.message()));
      if (cs_->ep && !op->done) force_close_locked();
    }
    (void)e.wait_quiet([&] { return op->done; }, 5s);
  }
  std::lock_guard lk(e.mu);
  if (!op->done) {
    // A broken invariant: UCX completes every request of a force-closed endpoint. The
    // get may still write `dest`, which we cannot keep alive; its Op at least stays
    // (never freed while the worker lives), and the connection is failed.
    KVS_LOG_ERROR("ucx: a read from {} did not complete after the endpoint closed", cs_->peer);
    cs_->stray_reads.push_back(std::move(op));
    return make_status(StatusCode::internal,
                       "ucx: a read from {} did not complete after the endpoint closed; its buffer may still be "
                       "written",
                       cs_->peer);
  }
  op->release();
  if (!s.ok()) return s;
  if (op->status != UCS_OK)
    return make_status(StatusCode::unavailable, "ucx: read from {} failed: {}", cs_->peer,
                       ucs_status_string(op->status));
  return {};
}

}  // namespace kvstream::transport::ucx_detail

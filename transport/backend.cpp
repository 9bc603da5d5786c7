#include <charconv>
#include <cstring>

#include "core/log.hpp"
#include "transport/backend_impl.hpp"

namespace kvstream::transport {

std::string_view memory_type_name(MemoryType t) noexcept { return t == MemoryType::cuda ? "cuda" : "host"; }

std::byte* MemoryRegion::data() const noexcept { return impl_ ? impl_->data : nullptr; }
size_t MemoryRegion::size() const noexcept { return impl_ ? impl_->size : 0; }
MemoryType MemoryRegion::type() const noexcept { return impl_ ? impl_->type : MemoryType::host; }
std::span<std::byte> MemoryRegion::span(size_t offset, size_t n) const noexcept {
  if (!impl_ || offset > impl_->size || n > impl_->size - offset) return {};
  return {impl_->data + offset, n};
}

Result<RemoteRegion> MemoryRegion::expose() const {
  if (!impl_ || impl_->size == 0) return make_status(StatusCode::invalid_argument, "expose: empty region");
  KVS_ASSIGN_OR_RETURN(auto key, impl_->packed_key());
  if (key.size() > kMaxRemoteKeyBytes)
    return make_status(StatusCode::resource_exhausted, "expose: a remote key of {} bytes exceeds {}", key.size(),
                       kMaxRemoteKeyBytes);
  return RemoteRegion{uint64_t(reinterpret_cast<uintptr_t>(impl_->data)), impl_->size, std::move(key)};
}

std::vector<std::byte> encode_remote(const RemoteRegion& r) {
  std::vector<std::byte> out(20 + r.key.size());
  const auto n = uint32_t(r.key.size());
  std::memcpy(out.data(), &r.address, 8);
  std::memcpy(out.data() + 8, &r.size, 8);
  std::memcpy(out.data() + 16, &n, 4);
  if (n) std::memcpy(out.data() + 20, r.key.data(), n);
  return out;
}

Result<RemoteRegion> decode_remote(std::span<const std::byte> b) {
  if (b.size() < 20) return make_status(StatusCode::corrupt_data, "remote region of {} bytes", b.size());
  RemoteRegion r;
  uint32_t n = 0;
  std::memcpy(&r.address, b.data(), 8);
  std::memcpy(&r.size, b.data() + 8, 8);
  std::memcpy(&n, b.data() + 16, 4);
  if (n > kMaxRemoteKeyBytes || b.size() != 20 + size_t(n))
    return make_status(StatusCode::corrupt_data, "remote region: key of {} bytes in {} bytes", n, b.size());
  r.key.assign(b.begin() + 20, b.end());
  return r;
}

std::shared_ptr<MemoryRegion::Impl> RegistrationCache::find(const void* data, size_t size, MemoryType type) {
  std::lock_guard lock(mu_);
  auto it = map_.find(Key{data, size, type});
  if (it == map_.end()) return nullptr;
  auto live = it->second.lock();
  if (!live) map_.erase(it);
  return live;
}

void RegistrationCache::insert(const std::shared_ptr<MemoryRegion::Impl>& region) {
  std::lock_guard lock(mu_);
  // Drop dead entries now and then so the map does not grow without bound.
  if (map_.size() > 1024)
    for (auto it = map_.begin(); it != map_.end();) it = it->second.expired() ? map_.erase(it) : std::next(it);
  map_[Key{region->data, region->size, region->type}] = region;
}

Status parse_host_port(const std::string& address, std::string& host, uint16_t& port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    return make_status(StatusCode::invalid_argument, "address '{}' is not host:port", address);
  host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned value = 0;
  const char* b = address.data() + colon + 1;
  const char* e = address.data() + address.size();
  auto [ptr, ec] = std::from_chars(b, e, value);
  if (ec != std::errc() || ptr != e || value > 65535)
    return make_status(StatusCode::invalid_argument, "address '{}' has a bad port", address);
  port = uint16_t(value);
  return {};
}

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
  if (!r.ok()) return detail::log_error(r.status());
  const Capabilities& c = (*r)->capabilities();
  KVS_LOG_INFO("transport: backend {} over {}, {} memory, one-sided reads {}", c.backend, c.provider,
               memory_type_name(config.memory), c.one_sided_read ? "yes" : "no");
  return r;
}

}  // namespace kvstream::transport

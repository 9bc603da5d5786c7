// MemoryRegion's handle operations and the wire form of an exposed region.
#include <cstring>

#include "transport/common/registration.hpp"

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

}  // namespace kvstream::transport

// Shared internals of the transport backends.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "kvstream/transport.hpp"

namespace kvstream::transport {

/// A registration. Backends derive from it and release their handle in the
/// destructor (RAII: the region lives as long as any MemoryRegion refers to it).
struct MemoryRegion::Impl {
  std::byte* data = nullptr;
  size_t size = 0;
  MemoryType type = MemoryType::host;
  virtual ~Impl() = default;
  /// The backend's packed remote key for this region (MemoryRegion::expose).
  virtual Result<std::vector<std::byte>> packed_key() const {
    return make_status(StatusCode::unsupported, "one-sided reads are not available on this backend");
  }
};

/// Registration cache: the same (address, size, type) maps to the same live
/// registration, so callers may register per transfer without paying for it.
class RegistrationCache {
 public:
  /// The cached region for the range, or null.
  std::shared_ptr<MemoryRegion::Impl> find(const void* data, size_t size, MemoryType type);
  void insert(const std::shared_ptr<MemoryRegion::Impl>& region);

 private:
  struct Key {
    const void* data;
    size_t size;
    MemoryType type;
    bool operator<(const Key& o) const {
      if (data != o.data) return data < o.data;
      if (size != o.size) return size < o.size;
      return type < o.type;
    }
  };
  std::mutex mu_;
  std::map<Key, std::weak_ptr<MemoryRegion::Impl>> map_;
};

/// Splits "host:port"; port must be 0..65535. Errors: invalid_argument.
Status parse_host_port(const std::string& address, std::string& host, uint16_t& port);

/// Backend factories (each present only when its library was found at configure time).
Result<std::unique_ptr<Backend>> make_tcp_backend(const BackendConfig& config);
Result<std::unique_ptr<Backend>> make_ucx_backend(const BackendConfig& config);
Result<std::unique_ptr<Backend>> make_ofi_backend(const BackendConfig& config);

}  // namespace kvstream::transport

// Registrations: what a backend keeps for a registered buffer, how the backends wrap
// it in the public MemoryRegion handle, and the cache that hands out one live
// registration per range.
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

/// The library's side door into MemoryRegion: backends wrap their registrations in
/// handles, and wrappers (the replicated client) look through a handle to its
/// registration. Not part of the public API.
struct RegionAccess {
  static MemoryRegion wrap(std::shared_ptr<MemoryRegion::Impl> impl) { return MemoryRegion(std::move(impl)); }
  static const std::shared_ptr<MemoryRegion::Impl>& of(const MemoryRegion& region) { return region.impl_; }
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

}  // namespace kvstream::transport

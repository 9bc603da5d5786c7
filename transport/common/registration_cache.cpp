#include "transport/common/registration.hpp"

namespace kvstream::transport {

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

}  // namespace kvstream::transport

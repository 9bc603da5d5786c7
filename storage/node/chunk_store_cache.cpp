// ChunkStore's cache of whole objects: least recently used first out, under its own
// limit and at the memory budget's call (reclaim).
#include <vector>

#include "storage/node/chunk_store.hpp"

namespace kvstream::storage {

void ChunkStore::cache_put_locked(const std::string& key, Bytes b) {
  cache_drop_locked(key);
  if (b->data.size() > cache_limit_) return;
  lru_.emplace_front(key, std::move(b));
  cache_[key] = lru_.begin();
  cache_used_ += lru_.front().second->data.size();
  while (cache_used_ > cache_limit_ && !lru_.empty()) {
    cache_used_ -= lru_.back().second->data.size();
    cache_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

void ChunkStore::cache_drop_locked(const std::string& key) {
  if (auto it = cache_.find(key); it != cache_.end()) {
    cache_used_ -= it->second->second->data.size();
    lru_.erase(it->second);
    cache_.erase(it);
  }
}

void ChunkStore::cache_drop_prefix_locked(const std::string& prefix) {
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->first.compare(0, prefix.size(), prefix) == 0) {
      cache_used_ -= it->second->data.size();
      cache_.erase(it->first);
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
}

// The budget wants room: the least recently used objects go first. Bytes still being
// sent stay alive (and leased) until their send ends.
void ChunkStore::reclaim(uint64_t bytes) {
  std::vector<Bytes> dropped;  // released after the lock
  std::lock_guard lock(mu_);
  uint64_t freed = 0;
  while (freed < bytes && !lru_.empty()) {
    freed += lru_.back().second->data.size();
    cache_used_ -= lru_.back().second->data.size();
    cache_.erase(lru_.back().first);
    dropped.push_back(std::move(lru_.back().second));
    lru_.pop_back();
  }
}

}  // namespace kvstream::storage

// The node's remembered removes (tombstones.hpp).
#include "storage/node/tombstones.hpp"

namespace kvstream::storage {

Tombstones::Tombstones(Limits limits, Now now) : now_(std::move(now)), limits_(limits) {}

void Tombstones::set_limits(Limits limits) {
  std::lock_guard lock(mu_);
  limits_ = limits;
  expire_locked();
}

void Tombstones::record(const std::string& ns, const std::string& ctx, uint64_t version) {
  std::lock_guard lock(mu_);
  if (limits_.max_entries == 0 || limits_.ttl.count() <= 0) return;
  Key key{ns, ctx};
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    ages_.push_back(key);
    it = entries_.emplace(std::move(key), Entry{version, now_(), std::prev(ages_.end())}).first;
  } else {
    it->second.version = std::max(it->second.version, version);
    it->second.at = now_();
    ages_.splice(ages_.end(), ages_, it->second.age);
  }
  expire_locked();
}

uint64_t Tombstones::removed_up_to(const std::string& ns, const std::string& ctx) {
  std::lock_guard lock(mu_);
  expire_locked();
  const auto it = entries_.find(Key{ns, ctx});
  return it == entries_.end() ? 0 : it->second.version;
}

std::vector<std::pair<std::string, uint64_t>> Tombstones::list(const std::string& ns) {
  std::lock_guard lock(mu_);
  expire_locked();
  std::vector<std::pair<std::string, uint64_t>> out;
  for (auto it = entries_.lower_bound(Key{ns, std::string()}); it != entries_.end() && it->first.first == ns; ++it)
    out.emplace_back(it->first.second, it->second.version);
  return out;
}

size_t Tombstones::size() {
  std::lock_guard lock(mu_);
  expire_locked();
  return entries_.size();
}

void Tombstones::expire_locked() {
  const auto now = now_();
  while (!ages_.empty()) {
    const auto it = entries_.find(ages_.front());
    if (entries_.size() <= limits_.max_entries && it->second.at + limits_.ttl > now) break;
    entries_.erase(it);
    ages_.pop_front();
  }
}

}  // namespace kvstream::storage

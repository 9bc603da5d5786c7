#include "storage/node/preauth_pool.hpp"

#include <algorithm>

namespace kvstream::storage {

Result<PreAuthPool::Ticket> PreAuthPool::admit(const std::string& source, const transport::CancelToken& cancel) {
  std::lock_guard lock(mu_);
  if (max_total_ == 0 || max_per_source_ == 0)
    return make_status(StatusCode::resource_exhausted, "no unauthenticated connections allowed");
  // A source at its limit gives up its own oldest place: it cannot hold more, and a
  // burst of its own logins (a runtime's workers starting together) only competes
  // with itself.
  // Unknown sources ("") are counted as one source but have no per-source bound.
  if (!source.empty()) {
    auto it = per_source_.find(source);
    if (it != per_source_.end() && it->second >= max_per_source_)
      evict_first_locked([&](const Place& p) { return p.source == source; });
  }
  // Every place taken: the source holding the most gives up its oldest, so a flooding
  // source pays first.
  while (!places_.empty() && places_.size() >= max_total_) {
    uint32_t most = 0;
    for (const auto& [s, n] : per_source_) most = std::max(most, n);
    evict_first_locked([&](const Place& p) { return per_source_.at(p.source) == most; });
  }
  const uint64_t id = next_id_++;
  places_.push_back({id, source, cancel});
  ++per_source_[source];
  return Ticket(this, id);
}

void PreAuthPool::evict_first_locked(const std::function<bool(const Place&)>& which) {
  for (auto it = places_.begin(); it != places_.end(); ++it)
    if (which(*it)) {
      it->cancel.cancel();
      drop_locked(it);
      ++evicted_;
      return;
    }
}

void PreAuthPool::drop_locked(std::list<Place>::iterator it) {
  if (auto s = per_source_.find(it->source); s != per_source_.end() && --s->second == 0) per_source_.erase(s);
  places_.erase(it);
}

void PreAuthPool::release(uint64_t id) noexcept {
  std::lock_guard lock(mu_);
  for (auto it = places_.begin(); it != places_.end(); ++it)
    if (it->id == id) return drop_locked(it);
}

uint64_t PreAuthPool::evicted() const {
  std::lock_guard lock(mu_);
  return evicted_;
}

std::string host_of(const std::string& address) {
  if (!address.empty() && address.front() == '[') {
    const auto close = address.find(']');
    return close == std::string::npos ? std::string() : address.substr(1, close - 1);
  }
  const auto colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace kvstream::storage

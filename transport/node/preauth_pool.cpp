#include "transport/node/preauth_pool.hpp"

#include <algorithm>

namespace kvstream::storage {

Result<PreAuthPool::Ticket> PreAuthPool::admit(const std::string& source, const transport::CancelToken& cancel) {
  std::lock_guard lock(mu_);
  if (max_total_ == 0 || max_per_source_ == 0)
    return make_status(StatusCode::resource_exhausted, "no unauthenticated connections allowed");
  // A source at its limit gives up its own oldest place: it cannot hold more, and a
  // burst of its own logins (a runtime's workers starting together) only competes
  // with itself.
  if (!source.empty()) {
    auto it = per_source_.find(source);
    if (it != per_source_.end() && it->second >= max_per_source_) evict_locked(source);
  }
  // Every place taken: the source holding the most gives up its oldest, so a flooding
  // source pays first.
  while (!places_.empty() && places_.size() >= max_total_) {
    uint32_t most = uint32_t(places_.size()) - held_by_known_locked();  // unknown sources count as one
    for (const auto& [s, n] : per_source_) most = std::max(most, n);
    // Among the sources holding the most, the oldest place goes.
    for (auto it = places_.begin(); it != places_.end(); ++it) {
      const auto s = per_source_.find(it->source);
      const uint32_t held = it->source.empty() ? uint32_t(places_.size()) - held_by_known_locked()
                                               : (s == per_source_.end() ? 0 : s->second);
      if (held == most) {
        it->cancel.cancel();
        drop_locked(it);
        ++evicted_;
        break;
      }
    }
  }
  const uint64_t id = next_id_++;
  places_.push_back({id, source, cancel});
  if (!source.empty()) ++per_source_[source];
  return Ticket(this, id);
}

uint32_t PreAuthPool::held_by_known_locked() const {
  uint32_t n = 0;
  for (const auto& [s, c] : per_source_) n += c;
  return n;
}

void PreAuthPool::evict_locked(const std::string& source) {
  for (auto it = places_.begin(); it != places_.end(); ++it)
    if (it->source == source) {
      it->cancel.cancel();
      drop_locked(it);
      ++evicted_;
      return;
    }
  // Not found (cannot happen while the counts agree): the oldest of all goes.
  places_.front().cancel.cancel();
  drop_locked(places_.begin());
  ++evicted_;
}

void PreAuthPool::drop_locked(std::list<Place>::iterator it) {
  if (!it->source.empty()) {
    auto s = per_source_.find(it->source);
    if (s != per_source_.end() && --s->second == 0) per_source_.erase(s);
  }
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
uint32_t PreAuthPool::held() const {
  std::lock_guard lock(mu_);
  return uint32_t(places_.size());
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

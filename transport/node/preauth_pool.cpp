#include "transport/node/preauth_pool.hpp"

namespace kvstream::storage {

Result<PreAuthPool::Ticket> PreAuthPool::admit(const std::string& source, const transport::CancelToken& cancel) {
  std::lock_guard lock(mu_);
  if (!source.empty()) {
    auto it = per_source_.find(source);
    if (it != per_source_.end() && it->second >= max_per_source_)
      return make_status(StatusCode::resource_exhausted, "{} unauthenticated connections from {}, the limit",
                         it->second, source);
  }
  while (!places_.empty() && places_.size() >= max_total_) {
    places_.front().cancel.cancel();
    drop_locked(places_.begin());
    ++evicted_;
  }
  if (max_total_ == 0) return make_status(StatusCode::resource_exhausted, "no unauthenticated connections allowed");
  const uint64_t id = next_id_++;
  places_.push_back({id, source, cancel});
  if (!source.empty()) ++per_source_[source];
  return Ticket(this, id);
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

#include "storage/node/namespace_quota.hpp"

#include <algorithm>

#include "core/log.hpp"

namespace kvstream::storage {

uint64_t QuotaLimits::of(const std::string& ns) const {
  const auto it = per_namespace.find(ns);
  return it == per_namespace.end() ? default_bytes : it->second;
}

Status NamespaceQuota::reserve(const std::string& ns, uint64_t length, uint64_t replaced) {
  Usage& u = usage_[ns];
  if (const uint64_t quota = limits_.of(ns); quota != 0) {
    // Charged what the put adds: an overwrite frees the bytes it replaces.
    const uint64_t after = u.stored + u.reserved + length - std::min(replaced, u.stored);
    if (after > quota) {
      ++refusals_;
      // A tenant's own doing, answered to it: not the node's news.
      KVS_LOG_DEBUG("namespace '{}': a put of {} bytes would bring it to {} bytes, over its quota of {}", ns,
                    length, after, quota);
      return detail::unlogged_status(StatusCode::no_space,
                                     "namespace '{}' holds {} bytes of its quota of {} ({} more in puts under way): "
                                     "a put of {} bytes does not fit",
                                     ns, u.stored, quota, u.reserved, length);
    }
  }
  u.reserved += length;
  return {};
}

void NamespaceQuota::release(const std::string& ns, uint64_t length) {
  auto it = usage_.find(ns);
  if (it == usage_.end()) return;
  it->second.reserved -= std::min(length, it->second.reserved);
  if (it->second.stored == 0 && it->second.reserved == 0) usage_.erase(it);
}

void NamespaceQuota::stored(const std::string& ns, uint64_t old_size, uint64_t new_size) {
  Usage& u = usage_[ns];
  u.stored = u.stored - std::min(old_size, u.stored) + new_size;
  if (u.stored == 0 && u.reserved == 0) usage_.erase(ns);
}

std::vector<Server::NamespaceUsage> NamespaceQuota::usage(const std::vector<std::string>& names) const {
  std::map<std::string, uint64_t> stored;  // by name, with every namespace to list
  for (const auto& ns : names) stored[ns] = 0;
  for (const auto& [ns, quota] : limits_.per_namespace) stored[ns] = 0;
  for (const auto& [ns, u] : usage_) stored[ns] = u.stored;
  std::vector<Server::NamespaceUsage> out;
  for (const auto& [ns, bytes] : stored) out.push_back({ns, bytes, limits_.of(ns)});
  return out;
}

uint64_t NamespaceQuota::used(const std::string& ns) const {
  const auto it = usage_.find(ns);
  return it == usage_.end() ? 0 : it->second.stored;
}

}  // namespace kvstream::storage

// What each namespace (tenant) keeps stored on a node, against its quota
// (ServerConfig::namespace_quota_bytes). Without quotas one authenticated tenant could
// fill the node's disk for every other. A put reserves its declared length when it
// begins and the reservation ends when it commits (the index then counts the bytes)
// or fails, so puts under way cannot together pass a quota. An overwrite is charged
// only what it adds to the object it replaces.
//
// Not thread-safe: the chunk store keeps it under its index lock, so a commit's
// new bytes and the end of its reservation are one step to a concurrent put's check.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "kvstream/status.hpp"
#include "kvstream/storage.hpp"

namespace kvstream::storage {

/// Bytes per namespace (as the chunk store charges them: each object's file rounded up
/// to the file system's allocation unit); 0 means no bound.
struct QuotaLimits {
  uint64_t default_bytes = 0;                         ///< every namespace not listed below
  std::map<std::string, uint64_t> per_namespace;      ///< overrides default_bytes
  [[nodiscard]] uint64_t of(const std::string& ns) const;
};

class NamespaceQuota {
 public:
  void set_limits(QuotaLimits limits) { limits_ = std::move(limits); }

  /// Claims `length` bytes for a put into `ns` that replaces an object of `replaced`
  /// bytes (0: a new object). Errors: no_space (the namespace would hold
  /// more than its quota; nothing is claimed).
  Status reserve(const std::string& ns, uint64_t length, uint64_t replaced);
  /// Ends a claim of reserve() (the put committed or failed).
  void release(const std::string& ns, uint64_t length);
  /// An object of `ns` went from `old_size` to `new_size` bytes charged (0: absent).
  void stored(const std::string& ns, uint64_t old_size, uint64_t new_size);

  /// Bytes `ns` holds (committed objects only).
  [[nodiscard]] uint64_t used(const std::string& ns) const;
  /// Puts refused for their namespace's quota since start.
  [[nodiscard]] uint64_t refusals() const { return refusals_; }
  /// The bytes stored and the quota of each of `names` and of every other namespace
  /// that holds bytes or has a quota of its own, by name.
  [[nodiscard]] std::vector<Server::NamespaceUsage> usage(const std::vector<std::string>& names) const;

 private:
  struct Usage {
    uint64_t stored = 0, reserved = 0;
  };
  QuotaLimits limits_;
  std::map<std::string, Usage> usage_;
  uint64_t refusals_ = 0;
};

}  // namespace kvstream::storage

// The master keys of encryption at rest (AtRestSettings::key_file) and the
// per-tenant keys derived from them.
//
// A tenant's key is HKDF-SHA256(master key, salt "kvstream at-rest v1", info =
// namespace): one file of master keys serves every tenant, and a key leaked from one
// tenant's derivation says nothing about another's. Each stored object names the id
// of the master key it was sealed under, so rotation only appends a key: new writes
// use the highest id, older objects stay readable under theirs until re-encrypted.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "kvstream/status.hpp"

namespace kvstream::security {

/// 256 bits of key.
using Key256 = std::array<uint8_t, 32>;

class KeyRing {
 public:
  /// Reads a key file (see AtRestSettings). Errors: not_found (no file),
  /// invalid_argument (a line that is not "<id> <64 hex>", a repeated id, no key),
  /// io_error. Warns when the file is readable by group or others.
  static Result<std::shared_ptr<const KeyRing>> load(const std::string& path);
  /// From keys in memory (tests, tools). Errors: invalid_argument (none, or id 0).
  static Result<std::shared_ptr<const KeyRing>> from_keys(std::map<uint32_t, Key256> keys);

  /// The id new objects are sealed under: the highest.
  [[nodiscard]] uint32_t current_id() const { return keys_.rbegin()->first; }
  [[nodiscard]] bool has(uint32_t id) const { return keys_.count(id) != 0; }
  [[nodiscard]] size_t size() const { return keys_.size(); }
  /// The key of namespace `ns` under master key `id` (derived once, then cached).
  /// Errors: not_found (the key file has no such id: the object cannot be read here,
  /// but it is not corrupt), internal (HKDF failed).
  Result<Key256> tenant_key(uint32_t id, std::string_view ns) const;

 private:
  explicit KeyRing(std::map<uint32_t, Key256> keys) : keys_(std::move(keys)) {}
  std::map<uint32_t, Key256> keys_;
  mutable std::mutex mu_;
  mutable std::map<std::pair<uint32_t, std::string>, Key256, std::less<>> derived_;
};

}  // namespace kvstream::security

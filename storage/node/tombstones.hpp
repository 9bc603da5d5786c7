// What a node remembers of the removes it was sent: per (namespace, context) the
// newest write version a remove covered (a tombstone). A copy of that context at or
// below it that arrives later (a rebalance from a node that was away when the remove
// was made, a put that crossed the remove) is refused, and the rebalance hands the
// tombstones to nodes that join, so a node coming back with its old disk drops its
// copies instead of serving them or handing them to their owners (docs/protocol.md,
// "Removes").
//
// Kept in memory only, bounded in count and age: a remove older than `ttl`, or pushed
// out by `max_entries` newer ones, is forgotten, and a restarted node starts with
// none (it learns again those its peers hand it when it joins). Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kvstream/transport.hpp"

namespace kvstream::storage {

struct TombstoneLimits {
  /// How long a remove is remembered after it was last recorded (0: not at all).
  std::chrono::seconds ttl{24 * 3600};
  /// How many are remembered at most; past it the oldest go first (0: none).
  size_t max_entries = 100000;
};

class Tombstones {
 public:
  using Limits = TombstoneLimits;
  using Now = std::function<transport::Clock::time_point()>;

  /// `now` is the clock of their ages (tests give a fake one).
  explicit Tombstones(Limits limits = {}, Now now = [] { return transport::Clock::now(); });

  void set_limits(Limits limits);
  /// A remove of `ctx` in `ns` covered the writes up to `version`: the tombstone keeps
  /// the highest version it was given and is as young as its last record.
  void record(const std::string& ns, const std::string& ctx, uint64_t version);
  /// The version up to which `ctx` was removed; 0 when no remove of it is remembered.
  [[nodiscard]] uint64_t removed_up_to(const std::string& ns, const std::string& ctx);
  /// Every remembered remove in `ns`: context and version, by context.
  [[nodiscard]] std::vector<std::pair<std::string, uint64_t>> list(const std::string& ns);
  /// How many are remembered (the expired ones dropped first).
  [[nodiscard]] size_t size();

 private:
  using Key = std::pair<std::string, std::string>;  // namespace, context
  struct Entry {
    uint64_t version = 0;
    transport::Clock::time_point at;
    std::list<Key>::iterator age;  // its place in ages_
  };
  void expire_locked();

  Now now_;
  std::mutex mu_;
  Limits limits_;
  std::map<Key, Entry> entries_;
  std::list<Key> ages_;  // oldest record first
};

}  // namespace kvstream::storage

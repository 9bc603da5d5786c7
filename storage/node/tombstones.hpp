// What a node remembers of the removes it was sent: per (namespace, context) the
// newest write version a remove covered (a tombstone). A copy of that context at or
// below it that arrives later (a rebalance from a node that was away when the remove
// was made, a put that crossed the remove) is refused, and the rebalance hands the
// tombstones to nodes that join, so a node coming back with its old disk drops its
// copies instead of serving them or handing them to their owners (docs/protocol.md,
// "Removes").
//
// Bounded in count and age: a remove older than `ttl` (wall clock, so ages outlive a
// restart), or pushed out past `max_entries` (the oldest of the namespace holding the
// most first), is forgotten; the newest pushed out is remembered (complete_since). With a file
// (persist_to, the node's `<dir>/.removes`) each record is synced there before the
// remove is acknowledged, and a restart reads them back. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <optional>
#include <vector>

#include "kvstream/status.hpp"
#include "kvstream/storage.hpp"
#include "storage/node/tombstone_log.hpp"

namespace kvstream::storage {

struct TombstoneLimits {
  /// How long a remove is remembered after it was last recorded (0: not at all).
  std::chrono::seconds ttl{24 * 3600};
  /// How many are remembered at most (0: none); past it the oldest of the namespace
  /// that holds the most go first, so one tenant's many removes push out its own.
  size_t max_entries = 100000;
};

class Tombstones {
 public:
  using Limits = TombstoneLimits;
  using Clock = std::chrono::system_clock;
  using Now = std::function<Clock::time_point()>;

  /// `now` is the clock of their ages (tests give a fake one).
  explicit Tombstones(Limits limits = {}, Now now = [] { return Clock::now(); });

  /// Keeps them in the file at `path` from now on: the records it holds are read
  /// back as they were (the next set_limits ages them), and each record() is synced
  /// there. Errors: io_error.
  Status persist_to(const std::string& path);
  void set_limits(Limits limits);
  [[nodiscard]] Limits limits() {
    std::lock_guard lock(mu_);
    return limits_;
  }
  /// A remove of `ctx` in `ns` covered the writes up to `version`: the tombstone keeps
  /// the highest version it was given and is as young as its last record. Errors:
  /// io_error (the file; remembered in memory all the same).
  Status record(const std::string& ns, const std::string& ctx, uint64_t version);
  /// record() of each of `removes` (contexts of `ns`), with one write and one sync of
  /// the file.
  Status record_many(const std::string& ns, std::span<const ContextRemove> removes);
  /// The version up to which `ctx` was removed; 0 when no remove of it is remembered.
  [[nodiscard]] uint64_t removed_up_to(const std::string& ns, const std::string& ctx);
  /// Every remembered remove in `ns`: context and version, by context.
  [[nodiscard]] std::vector<std::pair<std::string, uint64_t>> list(const std::string& ns);
  /// How many are remembered (the expired ones dropped first).
  [[nodiscard]] size_t size();
  /// Every remove of `ns` recorded after this time is remembered: `ttl` ago, or later
  /// where removes of `ns` were pushed out past the bound (the newest of those; kept
  /// in the file). A node away since before it may hold a context removed meanwhile
  /// that no member can hand it. nullopt where none are remembered (a limit of 0).
  [[nodiscard]] std::optional<Clock::time_point> complete_since(const std::string& ns);

 private:
  using Key = std::pair<std::string, std::string>;  // namespace, context
  struct Entry {
    uint64_t version = 0;
    Clock::time_point at;
    std::list<Key>::iterator age;     // its place in ages_
    std::list<Key>::iterator ns_age;  // its place in its namespace's list in by_ns_
  };
  void erase_locked(std::map<Key, Entry>::iterator it);
  // Records `version` at `at` (the newest version, the latest time) as the youngest.
  Entry& put_locked(Key key, uint64_t version, Clock::time_point at);
  void expire_locked();
  // A remove of `ns` recorded at `at` is forgotten: the namespace's horizon is at
  // least `at`.
  void forget_locked(const std::string& ns, Clock::time_point at);
  // Whether the file holds so many more lines than tombstones that it is rewritten,
  // and what it is rewritten with (oldest first).
  bool compaction_due_locked() const;
  std::vector<TombstoneRecord> records_locked() const;

  Now now_;
  std::mutex log_mu_;  // log_, and the order of its writes (taken before mu_)
  std::optional<TombstoneLog> log_;
  std::mutex mu_;
  Limits limits_;
  std::map<Key, Entry> entries_;
  std::list<Key> ages_;  // oldest record first
  std::map<std::string, std::list<Key>> by_ns_;  // the same, per namespace
  // Per namespace, the newest record pushed out past max_entries (its horizon), while
  // younger than ttl.
  std::map<std::string, Clock::time_point> forgotten_;
};

}  // namespace kvstream::storage

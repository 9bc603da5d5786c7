// What one KvStore holds (its config, profile, client, pipeline and scheduler) and
// the stats it reads: each chunk's stored level sizes and its own distortion, kept a
// moment for the fetch that follows a lookup. Shared by the store's put, lookup and
// eviction (kv_store.cpp) and its fetches (store_fetch.cpp).
#pragma once

#include <atomic>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "kvstream/adaptive_fetch.hpp"
#include "kvstream/kv_store.hpp"
#include "kvstream/scheduler.hpp"
#include "store/chunk_key.hpp"
#include "store/chunk_record.hpp"

namespace kvstream {

struct KvStore::Impl {
  StoreConfig cfg;
  codec::Profile profile;
  std::unique_ptr<storage::Client> client;
  store::ChunkKeyer keyer;
  std::unique_ptr<pipeline::Pipeline> pipe;
  pipeline::AdaptivePlan plan;
  std::unique_ptr<pipeline::Scheduler> scheduler;

  // Stats of a long prompt's chunks go out this many at a time (each is a round trip).
  static constexpr size_t kParallelStats = 8;

  // A small registered buffer for reading chunk records (eviction's scan), a slot per
  // read in flight; one scan at a time holds it.
  std::mutex record_mu;
  std::vector<std::byte> record_buf = std::vector<std::byte>(kParallelStats * store::kChunkRecordBytes);
  transport::MemoryRegion record_region;

  // Sizes read by recent stats (lookup), which a fetch right after takes instead of
  // asking again: a runtime looks a prompt up, then fetches it.
  struct Recent {
    std::vector<uint64_t> sizes;
    std::vector<double> distortion;  // per level, a progressive chunk's own (empty: unknown)
    transport::Clock::time_point when;
  };
  std::mutex recent_mu;
  std::unordered_map<std::string, Recent> recent;
  static constexpr size_t kMaxRecent = 4096;

  // Fills each empty entry of `got` (at most kParallelStats) with read(i), side by
  // side: one thread each beyond the first, which runs here, or here in turn when no
  // thread can be had. Returns when every read has ended.
  template <typename R, typename Read>
  static void read_side_by_side(std::vector<std::optional<R>>& got, const Read& read) {
    std::vector<std::future<R>> pending(got.size());
    for (size_t i = 1; i < got.size(); ++i) {
      if (got[i]) continue;
      try {
        pending[i] = std::async(std::launch::async, [&read, i] { return read(i); });
      } catch (const std::system_error&) {
        // No thread to be had: this one is read below, in turn.
      }
    }
    for (size_t i = 0; i < got.size(); ++i)
      if (!got[i]) got[i].emplace(pending[i].valid() ? pending[i].get() : read(i));
  }

  // Marks the chunks of `keys` (a prompt's, from its first) used now, each with its
  // depth, so that eviction goes by use (store/eviction.hpp). Never the caller's error:
  // a storage that keeps no marks is noted once and not asked again, and any other
  // failure is logged (eviction then sees the chunks as used when they were last marked).
  void mark_used(const std::vector<std::string>& keys, transport::Deadline deadline,
                 const transport::CancelToken& cancel = {});
  std::atomic<bool> marks_unsupported{false};

  void forget(const std::string& key) {
    std::lock_guard lk(recent_mu);
    recent.erase(key);
  }

  // The stored level sizes of one chunk; empty when it is not stored whole (levels
  // and record).
  Result<std::vector<uint64_t>> stat_one(const std::string& key, transport::Deadline deadline,
                                         const transport::CancelToken& cancel);

  // The stored sizes of each chunk of `keys`, in order, up to the first that is not
  // stored whole. `all`: every key, missing ones empty (put). `reuse`: sizes a stat
  // read less than storage.stat_reuse ago are taken as they are.
  Result<std::vector<std::vector<uint64_t>>> stat_chunks(const std::vector<std::string>& keys, bool all,
                                                         transport::Deadline deadline,
                                                         const transport::CancelToken& cancel, bool reuse = false);

  double level_loss(uint32_t level) const {
    return level < plan.level_quality_loss.size() ? plan.level_quality_loss[level] : 0.0;
  }

  // Each chunk's own quality loss per level, from the distortion its encoder measured
  // (stored with it) against the profile's mean distortion of that level: the
  // profile's measured loss scaled by how much worse or better this chunk codes. A
  // chunk of text unlike the profile's keeps a true estimate. Empty unless every key
  // has one (from the stats just read).
  std::vector<std::vector<double>> chunk_losses(const std::vector<std::string>& keys);
};

}  // namespace kvstream

// Refinement of a fetch of progressive chunks (pipeline.hpp, refine_fetch): only the
// bytes each kept prefix lacks cross the link, all of them in flight at once into one
// registered buffer, and each range's KV is then upgraded in place. It runs after the
// first token, off the critical path, so it does not overlap transfer and decode.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "kvstream/pipeline.hpp"
#include "kvstream/policy.hpp"

namespace kvstream::pipeline {

namespace {

// The range gets in flight: their buffer, its registration and the count still to
// complete. Shared with the callbacks, so that a return at the deadline leaves
// nothing a late callback could touch.
struct Landing {
  std::vector<std::byte> buffer;
  transport::MemoryRegion region;
  std::mutex mu;
  std::condition_variable cv;
  size_t left = 0;
  std::vector<Status> status;
};

}  // namespace

Result<RefineReport> refine_fetch(storage::Client& client, const codec::Profile& profile, RefineRequest& req) {
  const FetchRequest& f = req.fetch;
  if (!profile.progressive())
    return make_status(StatusCode::invalid_argument, "refine_fetch needs a progressive profile");
  if (!f.device.empty() || f.destination_memory != transport::MemoryType::host)
    return make_status(StatusCode::invalid_argument, "refine_fetch upgrades a host destination only");
  if (req.kept.size() != f.chunks.size())
    return make_status(StatusCode::invalid_argument, "{} kept prefixes for {} ranges", req.kept.size(), f.chunks.size());
  if (req.level >= profile.levels())
    return make_status(StatusCode::invalid_argument, "level {} of a {}-level profile", req.level, profile.levels());
  if (!req.levels.empty() && req.levels.size() != f.chunks.size())
    return make_status(StatusCode::invalid_argument, "{} target levels for {} ranges", req.levels.size(),
                       f.chunks.size());
  for (uint32_t l : req.levels)
    if (l != policy::kNotFetched && l >= profile.levels())
      return make_status(StatusCode::invalid_argument, "target level {} of a {}-level profile", l, profile.levels());
  KVS_ASSIGN_OR_RETURN(const auto sizes, range_level_bytes(client, f, true));
  // What each range lacks, laid out one after another in one buffer.
  struct Want {
    size_t range;
    uint64_t from, to, at;
  };
  std::vector<Want> wants;
  uint64_t total = 0;
  for (size_t i = 0; i < f.chunks.size(); ++i) {
    const uint32_t target = req.levels.empty() ? req.level : req.levels[i];
    if (req.kept[i].empty() || target == policy::kNotFetched) continue;
    if (sizes[i].size() != profile.levels())
      return make_status(StatusCode::invalid_argument, "range {}: {} stored levels, the profile has {}", i,
                         sizes[i].size(), profile.levels());
    const uint64_t have = req.kept[i].size(), to = sizes[i][target];
    if (to <= have) continue;
    wants.push_back({i, have, to, total});
    total += to - have;
  }
  RefineReport report;
  if (wants.empty()) return report;
  auto landing = std::make_shared<Landing>();
  landing->buffer.resize(total);
  KVS_ASSIGN_OR_RETURN(landing->region, client.register_memory(landing->buffer.data(), landing->buffer.size()));
  landing->left = wants.size();
  landing->status.resize(wants.size());
  for (size_t w = 0; w < wants.size(); ++w) {
    const Want& x = wants[w];
    client.get_range_async(stored_context(f, x.range), stored_chunk(f, x.range), 0, x.from, x.to - x.from, landing->region,
                           x.at, f.deadline, f.cancel, [landing, w](Result<size_t> r) {
                             std::lock_guard lock(landing->mu);
                             if (!r.ok()) landing->status[w] = r.status();
                             if (--landing->left == 0) landing->cv.notify_all();
                           });
  }
  {
    // The client completes every get by the deadline; the margin covers its own
    // cancellation path.
    std::unique_lock lock(landing->mu);
    if (!landing->cv.wait_until(lock, f.deadline + std::chrono::seconds(2), [&] { return landing->left == 0; }))
      return make_status(StatusCode::timed_out, "refinement: {} of {} range gets still open past the deadline",
                         landing->left, wants.size());
  }
  for (size_t w = 0; w < wants.size(); ++w)
    if (!landing->status[w].ok()) return landing->status[w].with_context(fmt::format("range {}", wants[w].range));
  const std::vector<std::byte>& buffer = landing->buffer;

  // Upgrade each range in place, on up to decode_threads threads.
  std::atomic<size_t> next{0};
  std::vector<Status> errors(std::max(1u, req.decode_threads));
  std::atomic<uint32_t> refined{0};
  auto work = [&](unsigned id) {
    codec::DecodeScratch scratch;
    for (size_t w; (w = next.fetch_add(1)) < wants.size();) {
      const Want& x = wants[w];
      const std::span<const uint8_t> more(reinterpret_cast<const uint8_t*>(buffer.data()) + x.at, x.to - x.from);
      auto view = f.destination.slice(f.chunks[x.range]);
      Status st = view.ok() ? codec::refine_chunk(profile, req.kept[x.range], more, *view, &scratch) : view.status();
      if (!st.ok()) {
        if (errors[id].ok()) errors[id] = st.with_context(fmt::format("range {}", x.range));
        continue;
      }
      req.kept[x.range].insert(req.kept[x.range].end(), more.begin(), more.end());
      ++refined;
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < errors.size(); ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& t : pool) t.join();
  report.chunks_refined = refined;
  report.bytes = total;
  for (const Status& e : errors) KVS_RETURN_IF_ERROR(e);
  return report;
}

}  // namespace kvstream::pipeline

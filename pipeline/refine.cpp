// Refinement of a fetch of progressive chunks (pipeline.hpp, refine_fetch): only the
// bytes each kept prefix lacks cross the link, all of them in flight at once into one
// registered buffer, and each range's KV is then upgraded in place: by the CPU decoder
// in host memory, by a GpuDecoder in device memory. It runs after the first token, off
// the critical path, so it does not overlap transfer and decode.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "kvstream/gpu_decoder.hpp"
#include "kvstream/gpu_resources.hpp"
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
  const bool on_device = !f.device.empty() || f.destination_memory == transport::MemoryType::cuda;
  if (!f.device.empty() && f.device.chunks.size() != f.chunks.size())
    return make_status(StatusCode::invalid_argument, "{} device pointers for {} ranges", f.device.chunks.size(),
                       f.chunks.size());
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
  // Device KV is upgraded by a decoder on its GPU, made before any byte moves: where
  // that GPU is not usable the refinement fails here, naming why, with nothing fetched.
  std::unique_ptr<gpu::GpuDecoder> gpu_decoder;
  gpu::Stream stream;
  if (on_device) {
    auto made = gpu::GpuDecoder::create(profile, req.gpu_device);
    if (!made.ok()) return made.status().with_context(fmt::format("refining device KV on GPU {}", req.gpu_device));
    gpu_decoder = std::move(*made);
    KVS_ASSIGN_OR_RETURN(stream, gpu::Stream::create(req.gpu_device));
  }
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

  // The range's KV: a slice of the destination view, or the packed device memory that
  // FetchRequest::device gave for it (starting at the chunk's first position).
  auto view_of = [&](size_t range) -> Result<KvView> {
    if (f.device.empty()) return f.destination.slice(f.chunks[range]);
    KVS_ASSIGN_OR_RETURN(const codec::ChunkInfo info, codec::inspect_chunk(req.kept[range]));
    return KvView::packed(f.device.chunks[range], f.device.dtype, profile.geometry(), f.chunks[range].size(),
                          info.first_position);
  };
  // Upgrade each range in place, on up to decode_threads threads (one on the GPU: the
  // decoder runs one chunk at a time, each using the whole device).
  std::atomic<size_t> next{0};
  std::vector<Status> errors(gpu_decoder ? 1u : std::max(1u, req.decode_threads));
  std::atomic<uint32_t> refined{0};
  auto work = [&](unsigned id) {
    codec::DecodeScratch scratch;
    for (size_t w; (w = next.fetch_add(1)) < wants.size();) {
      const Want& x = wants[w];
      const std::span<const uint8_t> more(reinterpret_cast<const uint8_t*>(buffer.data()) + x.at, x.to - x.from);
      auto view = view_of(x.range);
      Status st = !view.ok()     ? view.status()
                  : gpu_decoder ? gpu_decoder->refine(req.kept[x.range], more, *view, stream.handle())
                                : codec::refine_chunk(profile, req.kept[x.range], more, *view, &scratch);
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

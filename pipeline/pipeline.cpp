// The pipeline (pipeline_impl.hpp): its receive buffers, back-pressure and decode
// workers, the checks of a fetch request, and Pipeline::create.
#include "pipeline/pipeline_impl.hpp"

#include <algorithm>

namespace kvstream::pipeline {
namespace detail {

using namespace std::chrono_literals;

PipelineImpl::~PipelineImpl() {
  {
    std::lock_guard lock(jobs_mu_);
    stopping_ = true;
  }
  jobs_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

Status PipelineImpl::init() {
  if (cfg_.depth == 0 || cfg_.depth > 1024) return make_status(StatusCode::invalid_argument, "depth {}", cfg_.depth);
  if (cfg_.max_chunk_bytes == 0 || cfg_.max_chunk_bytes > storage::kMaxChunkBytes)
    return make_status(StatusCode::invalid_argument, "max_chunk_bytes {}", cfg_.max_chunk_bytes);
  if (cfg_.decode_threads == 0 || cfg_.decode_threads > 256)
    return make_status(StatusCode::invalid_argument, "decode_threads {}", cfg_.decode_threads);
  if (cfg_.gpudirect) KVS_RETURN_IF_ERROR(check_gpudirect());
  for (uint32_t b = 0; b < cfg_.depth; ++b) {
    // Pre-faulted once here, registered once, reused by every fetch. With GPUDirect
    // chunks land in device buffers (below) and these hold their host copies.
    buffers_.emplace_back(cfg_.max_chunk_bytes, std::byte{0});
    if (!cfg_.gpudirect) {
      KVS_ASSIGN_OR_RETURN(auto mr, client_.register_memory(buffers_.back().data(), buffers_.back().size()));
      regions_.push_back(std::move(mr));
    }
    free_.push_back(b);
  }
  KVS_RETURN_IF_ERROR(choose_decode());
  if (cfg_.gpudirect) KVS_RETURN_IF_ERROR(start_gpudirect());
  for (unsigned t = 0; t < cfg_.decode_threads; ++t)
    workers_.emplace_back([this, t] { work(gpu_workers_.empty() ? nullptr : &gpu_workers_[t]); });
  return {};
}

Result<std::shared_ptr<Fetch>> PipelineImpl::fetch(FetchRequest req, FetchCallbacks cb) {
  if (!req.device.empty()) {
    KVS_RETURN_IF_ERROR(check_device_destination(req));
  } else {
    if (req.destination_memory == transport::MemoryType::cuda) KVS_RETURN_IF_ERROR(check_device_view(req));
    const KvGeometry& g = profile_.geometry();
    if (!(req.destination.geometry() == g))
      return make_status(StatusCode::invalid_argument, "destination geometry does not match the codec profile");
    for (size_t i = 0; i < req.chunks.size(); ++i)
      if (req.chunks[i].begin >= req.chunks[i].end || req.chunks[i].end > req.destination.tokens())
        return make_status(StatusCode::invalid_argument, "chunk {} range [{}, {}) outside the {}-token destination",
                           i, req.chunks[i].begin, req.chunks[i].end, req.destination.tokens());
  }
  if (!req.stored_chunks.empty() && req.stored_chunks.size() != req.chunks.size())
    return make_status(StatusCode::invalid_argument, "{} stored chunk ids for {} ranges", req.stored_chunks.size(),
                       req.chunks.size());
  if (!req.stored_contexts.empty() && req.stored_contexts.size() != req.chunks.size())
    return make_status(StatusCode::invalid_argument, "{} stored contexts for {} ranges", req.stored_contexts.size(),
                       req.chunks.size());
  if (!req.level_bytes.empty() && req.level_bytes.size() != req.chunks.size())
    return make_status(StatusCode::invalid_argument, "level sizes of {} chunks for {} ranges", req.level_bytes.size(),
                       req.chunks.size());
  // The sizes of every level of every range's chunk, before anything is fetched; the
  // caller's are moved out of the request, so the fetch keeps one copy.
  KVS_ASSIGN_OR_RETURN(auto sizes, req.level_bytes.empty() ? range_level_bytes(client_, req, profile_.progressive())
                                                           : Result<std::vector<std::vector<uint64_t>>>(
                                                                 std::move(req.level_bytes)));
  auto f = std::make_shared<FetchImpl>(*this, std::move(req), std::move(cb), std::move(sizes));
  f->start();
  return std::shared_ptr<Fetch>(f);
}

uint32_t PipelineImpl::buffers_in_use() const {
  std::lock_guard lock(free_mu_);
  return cfg_.depth - uint32_t(free_.size());
}

Result<uint32_t> PipelineImpl::acquire(transport::Deadline deadline, const transport::CancelToken& cancel) {
  std::unique_lock lock(free_mu_);
  while (free_.empty()) {
    if (cancel.cancelled()) return make_status(StatusCode::cancelled, "cancelled while waiting for a buffer");
    if (Clock::now() >= deadline) return make_status(StatusCode::timed_out, "deadline passed waiting for a buffer");
    free_cv_.wait_for(lock, 5ms);
  }
  const uint32_t b = free_.front();
  free_.pop_front();
  return b;
}

void PipelineImpl::release(uint32_t b) {
  {
    std::lock_guard lock(free_mu_);
    free_.push_back(b);
  }
  free_cv_.notify_one();
}

void PipelineImpl::submit_decode(std::shared_ptr<FetchImpl> f, uint32_t chunk, uint32_t buffer, size_t len) {
  {
    std::lock_guard lock(jobs_mu_);
    jobs_.push_back({std::move(f), chunk, buffer, len});
  }
  jobs_cv_.notify_one();
}

void PipelineImpl::work(GpuWorker* gpu) {
  for (;;) {
    Job j;
    {
      std::unique_lock lock(jobs_mu_);
      jobs_cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      j = std::move(jobs_.front());
      jobs_.pop_front();
    }
    j.fetch->decode(j.chunk, j.buffer, j.len, gpu);
  }
}

}  // namespace detail

std::string_view decode_on_name(DecodeOn d) noexcept {
  switch (d) {
    case DecodeOn::cpu: return "cpu";
    case DecodeOn::gpu: return "gpu";
    case DecodeOn::automatic: return "auto";
  }
  return "?";
}

Result<DecodeOn> parse_decode_on(std::string_view name) {
  for (DecodeOn d : {DecodeOn::cpu, DecodeOn::gpu, DecodeOn::automatic})
    if (name == decode_on_name(d)) return d;
  return make_status(StatusCode::invalid_argument, "decode '{}': expected cpu, gpu or auto", name);
}

Result<std::unique_ptr<Pipeline>> Pipeline::create(storage::Client& client, const codec::Profile& profile,
                                                   const PipelineConfig& config) {
  auto p = std::make_unique<detail::PipelineImpl>(client, profile, config);
  KVS_RETURN_IF_ERROR(p->init());
  return std::unique_ptr<Pipeline>(std::move(p));
}

}  // namespace kvstream::pipeline

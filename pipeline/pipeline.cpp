// The streaming pipeline. A dispatcher thread per fetch walks the chunks in order:
// it takes a free receive buffer (back-pressure: at most `depth` chunks are on the
// wire or waiting to decode), waits until fewer than `max_on_wire` transfers are
// outstanding, asks the decision callback, and issues the get. When a
// chunk's bytes land, a decode worker decodes it straight from that buffer into the
// runtime's memory and returns the buffer. So chunk i+1.. travel while chunk i decodes.
//
// On the GPU path (PipelineConfig::decode) the receive buffers are also page-locked
// and each decode worker owns a GpuDecoder and a CUDA stream: a landed chunk is
// uploaded by DMA from its buffer and decoded on that worker's stream, into device
// memory (FetchRequest::device) or, for a host destination, copied back.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/ranges.h>

#include "core/log.hpp"
#include "kvstream/gpu.hpp"
#include "kvstream/gpu_decoder.hpp"
#include "kvstream/gpu_resources.hpp"
#include "kvstream/pipeline.hpp"

namespace kvstream::pipeline {

namespace {

using namespace std::chrono_literals;

class PipelineImpl;

// What one decode worker owns on the GPU path: decode() synchronizes its stream
// before returning (the rANS checks are read back), so concurrency across chunks comes
// from several workers, each with its own decoder (not thread-safe) and stream.
struct GpuWorker {
  std::unique_ptr<gpu::GpuDecoder> decoder;
  gpu::Stream stream;
};

class FetchImpl final : public Fetch, public std::enable_shared_from_this<FetchImpl> {
 public:
  FetchImpl(PipelineImpl& p, FetchRequest req, FetchCallbacks cb, std::vector<std::vector<uint64_t>> sizes)
      : p_(p), req_(std::move(req)), cb_(std::move(cb)), sizes_(std::move(sizes)) {
    timings_.resize(req_.chunks.size());
    for (uint32_t i = 0; i < timings_.size(); ++i) timings_[i].chunk = i;
    remaining_ = uint32_t(req_.chunks.size());
  }
  ~FetchImpl() override {
    // The last reference may be dropped on the dispatcher thread itself.
    if (dispatcher_.joinable()) {
      if (dispatcher_.get_id() == std::this_thread::get_id())
        dispatcher_.detach();
      else
        dispatcher_.join();
    }
  }

  void start() { dispatcher_ = std::thread([self = shared_from_this()] { self->dispatch(); }); }

  Status wait() override {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return remaining_ == 0; });
    return first_error_;
  }
  void cancel() override { req_.cancel.cancel(); }
  std::vector<std::vector<uint8_t>> take_kept_bytes() override {
    std::lock_guard lock(mu_);
    std::vector<std::vector<uint8_t>> out(req_.chunks.size());
    if (kept_.size() == out.size()) out.swap(kept_);
    return out;
  }
  std::vector<ChunkTimings> timings() const override {
    std::lock_guard lock(mu_);
    return timings_;
  }

  // Called by a decode worker: decode chunk i from its buffer, then finish it. `gpu`
  // is the worker's GPU decoder and stream, null on the CPU path.
  void decode(uint32_t i, uint32_t buffer, size_t len, GpuWorker* gpu);

 private:
  PipelineImpl& p_;
  FetchRequest req_;
  FetchCallbacks cb_;
  std::vector<std::vector<uint64_t>> sizes_;  // stored level sizes of range i (empty: none stored)
  std::vector<std::vector<uint8_t>> kept_;     // FetchRequest::keep_bytes: range i's fetched bytes
  std::thread dispatcher_;
  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  std::vector<ChunkTimings> timings_;
  uint32_t remaining_ = 0;
  uint32_t on_wire_ = 0;  // transfers requested and not landed (under mu_)
  std::condition_variable on_wire_cv_;
  Status first_error_;

  void dispatch();
  // Waits until fewer than `limit` transfers are outstanding; the fetch's deadline or
  // cancel ends the wait.
  Status wait_on_wire_below(uint32_t limit);
  Status decode_cpu(uint32_t i, std::span<const uint8_t> bytes);
  // `landed`: with GPUDirect, the chunk where it landed in device memory (`bytes` is
  // then its host copy, for the checks).
  Status decode_gpu(uint32_t i, std::span<const uint8_t> bytes, GpuWorker& gpu, const void* landed);
  // Records the end of chunk i (with `st`), tells the runtime, wakes wait().
  void finish(uint32_t i, Status st);
  Status over() const {
    if (req_.cancel.cancelled()) return make_status(StatusCode::cancelled, "fetch of '{}' cancelled", req_.context);
    if (Clock::now() >= req_.deadline)
      return make_status(StatusCode::timed_out, "fetch of '{}' passed its deadline", req_.context);
    return {};
  }
};

class PipelineImpl final : public Pipeline {
 public:
  PipelineImpl(storage::Client& client, const codec::Profile& profile, const PipelineConfig& cfg)
      : client_(client), profile_(profile), cfg_(cfg) {}

  ~PipelineImpl() override {
    {
      std::lock_guard lock(jobs_mu_);
      stopping_ = true;
    }
    jobs_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  Status init() {
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

  DecodeOn decodes_on() const override { return decodes_on_; }
  const codec::Profile& profile() const override { return profile_; }

  Result<std::shared_ptr<Fetch>> fetch(FetchRequest req, FetchCallbacks cb) override {
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

  uint32_t buffers_in_use() const override {
    std::lock_guard lock(free_mu_);
    return cfg_.depth - uint32_t(free_.size());
  }

  // Takes a free buffer, waiting while all are lent (back-pressure).
  Result<uint32_t> acquire(transport::Deadline deadline, const transport::CancelToken& cancel) {
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
  void release(uint32_t b) {
    {
      std::lock_guard lock(free_mu_);
      free_.push_back(b);
    }
    free_cv_.notify_one();
  }
  void submit_decode(std::shared_ptr<FetchImpl> f, uint32_t chunk, uint32_t buffer, size_t len) {
    {
      std::lock_guard lock(jobs_mu_);
      jobs_.push_back({std::move(f), chunk, buffer, len});
    }
    jobs_cv_.notify_one();
  }

  storage::Client& client_;
  const codec::Profile& profile_;
  PipelineConfig cfg_;
  std::vector<std::vector<std::byte>> buffers_;
  std::vector<gpu::DeviceBuffer> device_buffers_;  // GPUDirect: where chunks land
  // Both refer to buffers_ (regions_: to device_buffers_ with GPUDirect), so they are
  // declared after them (destroyed before them).
  std::vector<transport::MemoryRegion> regions_;
  std::vector<gpu::PinnedHostMemory> pinned_;  // GPU path: buffers_ page-locked

 private:
  struct Job {
    std::shared_ptr<FetchImpl> fetch;
    uint32_t chunk, buffer;
    size_t len;
  };
  mutable std::mutex free_mu_;
  std::condition_variable free_cv_;
  std::deque<uint32_t> free_;
  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  DecodeOn decodes_on_ = DecodeOn::cpu;
  std::string cpu_reason_;               // why decode=auto took the CPU (empty otherwise)
  std::vector<GpuWorker> gpu_workers_;   // one per decode thread on the GPU path
  std::vector<std::thread> workers_;

  // GPUDirect registers device memory with the client's backend
  // (Client::register_memory with MemoryType::cuda), so it is only as possible as the
  // backend says.
  Status check_gpudirect() const {
    if (cfg_.decode == DecodeOn::cpu)
      return make_status(StatusCode::invalid_argument,
                         "GPUDirect lands chunks in device memory, which decode=cpu cannot read; use decode=gpu");
    const transport::Capabilities* caps = client_.capabilities();
    if (caps == nullptr)
      return make_status(StatusCode::unsupported,
                         "GPUDirect: the storage client does not report its transport backend's capabilities, so it "
                         "lands chunks in host memory only (none of the backends built here, {}, declares "
                         "Capabilities::cuda_memory); use the pinned host path (gpudirect = false)",
                         fmt::join(transport::available_backends(), ", "));
    if (!caps->cuda_memory)
      return make_status(StatusCode::unsupported,
                         "GPUDirect: transport backend '{}' ({}) cannot land chunks in GPU memory "
                         "(Capabilities::cuda_memory is false); use the pinned host path (gpudirect = false)",
                         caps->backend, caps->provider);
    return {};
  }

  // GPUDirect's receive buffers: device memory of gpu_device, registered with the
  // client's backend as MemoryType::cuda, one per buffer slot.
  Status start_gpudirect() {
    if (decodes_on_ != DecodeOn::gpu)
      return make_status(StatusCode::unavailable, "GPUDirect needs the GPU decode path, and decode=auto took the CPU: {}",
                         cpu_reason_);
    for (uint32_t b = 0; b < cfg_.depth; ++b) {
      KVS_ASSIGN_OR_RETURN(auto d, gpu::DeviceBuffer::allocate(cfg_.max_chunk_bytes, cfg_.gpu_device));
      device_buffers_.push_back(std::move(d));
      auto mr = client_.register_memory(device_buffers_.back().data(), cfg_.max_chunk_bytes, transport::MemoryType::cuda);
      if (!mr.ok()) return mr.status().with_context("GPUDirect: registering a device receive buffer");
      if (mr->type() != transport::MemoryType::cuda)
        return make_status(StatusCode::internal, "GPUDirect: the client registered device memory as {}",
                           transport::memory_type_name(mr->type()));
      regions_.push_back(std::move(mr).value());
    }
    KVS_LOG_INFO("pipeline: GPUDirect: {} device receive buffers of {} bytes registered with backend '{}'", cfg_.depth,
                 cfg_.max_chunk_bytes, client_.capabilities()->backend);
    return {};
  }

  // Resolves cfg_.decode: on the GPU path, one decoder and one stream per worker, and
  // the receive buffers page-locked so that uploads are DMA from where chunks land.
  Status choose_decode() {
    if (cfg_.decode == DecodeOn::cpu) {
      KVS_LOG_INFO("pipeline: decoding on the CPU ({} threads, {} buffers of {} bytes)", cfg_.decode_threads,
                   cfg_.depth, cfg_.max_chunk_bytes);
      return {};
    }
    Status st = start_gpu();
    if (st.ok()) {
      decodes_on_ = DecodeOn::gpu;
      const auto info = gpu::probe_device();
      KVS_LOG_INFO("pipeline: decoding on GPU {} ({}): {} decoders with a stream each, {} page-locked buffers of {} "
                   "bytes",
                   cfg_.gpu_device, info.ok() ? info->name : "?", cfg_.decode_threads, cfg_.depth,
                   cfg_.max_chunk_bytes);
      return {};
    }
    gpu_workers_.clear();
    pinned_.clear();
    if (cfg_.decode == DecodeOn::gpu) return st.with_context("pipeline decode=gpu");
    // automatic: the CPU. When no GPU is usable at all, gpu::probe_device() has said
    // why once per process (the CUDA error, "using the CPU path"), so this line does
    // not repeat it on every create; other reasons (a decoder that cannot start) are
    // said here.
    cpu_reason_ = st.message();
    if (gpu::probe_device().ok())
      KVS_LOG_WARN("pipeline: decode=auto: decoding on the CPU ({} threads) because {}", cfg_.decode_threads,
                   cpu_reason_);
    else
      KVS_LOG_INFO("pipeline: decoding on the CPU ({} threads, decode=auto: no usable GPU)", cfg_.decode_threads);
    return {};
  }

  Status start_gpu() {
    KVS_ASSIGN_OR_RETURN(const gpu::DeviceInfo info, gpu::probe_device());
    (void)info;
    for (unsigned t = 0; t < cfg_.decode_threads; ++t) {
      GpuWorker w;
      KVS_ASSIGN_OR_RETURN(w.decoder, gpu::GpuDecoder::create(profile_, cfg_.gpu_device));
      KVS_ASSIGN_OR_RETURN(w.stream, gpu::Stream::create(cfg_.gpu_device));
      gpu_workers_.push_back(std::move(w));
    }
    for (auto& b : buffers_) {
      KVS_ASSIGN_OR_RETURN(auto pin, gpu::PinnedHostMemory::register_range(b.data(), b.size()));
      pinned_.push_back(std::move(pin));
    }
    return {};
  }

  Status check_device_destination(const FetchRequest& req) const {
    if (decodes_on_ != DecodeOn::gpu)
      return make_status(StatusCode::invalid_argument, "a device destination needs a GPU pipeline; this one decodes "
                                                       "on the CPU{}",
                         cpu_reason_.empty() ? "" : " (decode=auto: " + cpu_reason_ + ")");
    const DeviceDestination& d = req.device;
    if (d.chunks.size() != req.chunks.size())
      return make_status(StatusCode::invalid_argument, "device destination has {} chunk pointers for {} chunks",
                         d.chunks.size(), req.chunks.size());
    if (d.dtype != DType::f16 && d.dtype != DType::bf16 && d.dtype != DType::f32)
      return make_status(StatusCode::invalid_argument, "device destination element type {} (f16, bf16 or f32)",
                         int(d.dtype));
    for (size_t i = 0; i < req.chunks.size(); ++i) {
      if (req.chunks[i].begin >= req.chunks[i].end)
        return make_status(StatusCode::invalid_argument, "chunk {} range [{}, {}) is empty", i, req.chunks[i].begin,
                           req.chunks[i].end);
      if (Status st = gpu::check_device_pointer(d.chunks[i], cfg_.gpu_device); !st.ok())
        return make_status(StatusCode::invalid_argument, "device destination of chunk {}: {}", i, st.message());
    }
    return {};
  }

  // A destination view in device memory: only a GPU pipeline writes there, and every
  // plane must be memory of its device (a host pointer would fault in the kernel).
  Status check_device_view(const FetchRequest& req) const {
    if (decodes_on_ != DecodeOn::gpu)
      return make_status(StatusCode::invalid_argument, "a destination in device memory needs a GPU pipeline; this one "
                                                       "decodes on the CPU");
    const KvView& v = req.destination;
    if (v.tokens() == 0) return make_status(StatusCode::invalid_argument, "device destination view is empty");
    for (uint32_t l = 0; l < v.geometry().layers; ++l)
      for (uint32_t pl = 0; pl < v.geometry().planes(); ++pl)
        if (Status st = gpu::check_device_pointer(v.row(l, pl, 0), cfg_.gpu_device); !st.ok())
          return make_status(StatusCode::invalid_argument, "device destination view, layer {} plane {}: {}", l, pl,
                             st.message());
    return {};
  }

  void work(GpuWorker* gpu) {
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
};

void FetchImpl::dispatch() {
  // Each chunk is decided as late as it can be: once a receive buffer is free and fewer
  // than max_on_wire transfers are outstanding. A decision made earlier would use an
  // older throughput estimate and could not follow a change of the link. A chunk
  // decided as text gives its buffer to the next one.
  std::optional<uint32_t> held;
  const uint32_t max_on_wire = p_.cfg_.max_on_wire ? p_.cfg_.max_on_wire : p_.cfg_.depth;
  // Ends chunk i here (text, an error, the fetch over). The last chunk first gives back
  // a buffer no later chunk will take: its finish may end the fetch, and a fetch that
  // has ended holds no buffer (buffers_in_use() is 0 once every wait() returned).
  auto end_here = [&](uint32_t i, Status st) {
    if (held && i + 1 == req_.chunks.size()) {
      p_.release(*held);
      held.reset();
    }
    finish(i, std::move(st));
  };
  for (uint32_t i = 0; i < req_.chunks.size(); ++i) {
    if (Status st = over(); !st.ok()) {
      end_here(i, st);
      continue;
    }
    if (!held) {
      auto buffer = p_.acquire(req_.deadline, req_.cancel);
      if (!buffer.ok()) {
        end_here(i, buffer.status());
        continue;
      }
      held = *buffer;
    }
    if (Status st = wait_on_wire_below(max_on_wire); !st.ok()) {
      end_here(i, st);
      continue;
    }
    const uint32_t stored = stored_chunk(req_, i);
    const std::span<const uint64_t> level_bytes(sizes_[i]);
    const ChunkDecision d = cb_.decide ? cb_.decide(i, level_bytes) : ChunkDecision{};
    {
      std::lock_guard lock(mu_);
      timings_[i].decision = d;
      timings_[i].queued = Clock::now();
    }
    if (d.action == ChunkDecision::Action::recompute) {
      end_here(i, {});
      continue;
    }
    if (d.level >= level_bytes.size() || level_bytes[d.level] == 0) {
      end_here(i, make_status(StatusCode::not_found, "chunk {} has no level {} stored", i, d.level));
      continue;
    }
    if (level_bytes[d.level] > p_.cfg_.max_chunk_bytes) {
      end_here(i, make_status(StatusCode::resource_exhausted, "chunk {} level {} is {} bytes, buffers hold {}", i,
                              d.level, level_bytes[d.level], p_.cfg_.max_chunk_bytes));
      continue;
    }
    const uint32_t b = *held;
    held.reset();
    {
      std::lock_guard lock(mu_);
      timings_[i].wire_start = Clock::now();
      ++on_wire_;
    }
    auto landed = [self = shared_from_this(), i, b](Result<size_t> r) {
      {
        std::lock_guard lock(self->mu_);
        self->timings_[i].wire_end = Clock::now();
        if (r.ok()) self->timings_[i].bytes = *r;
        --self->on_wire_;
      }
      self->on_wire_cv_.notify_all();
      if (!r.ok()) {
        self->p_.release(b);
        self->finish(i, r.status().with_context(fmt::format("chunk {}", i)));
        return;
      }
      self->p_.submit_decode(self, i, b, *r);
    };
    // A progressive chunk is one object: the level is the prefix of its size.
    if (p_.profile_.progressive())
      p_.client_.get_range_async(stored_context(req_, i), stored, 0, 0, level_bytes[d.level], p_.regions_[b], 0,
                                 req_.deadline, req_.cancel, std::move(landed));
    else
      p_.client_.get_async(stored_context(req_, i), stored, d.level, p_.regions_[b], 0, p_.cfg_.max_chunk_bytes,
                           req_.deadline, req_.cancel, std::move(landed));
  }
  if (held) p_.release(*held);
}

Status FetchImpl::wait_on_wire_below(uint32_t limit) {
  std::unique_lock lock(mu_);
  while (on_wire_ >= limit) {
    if (Status st = over(); !st.ok()) return st;
    on_wire_cv_.wait_for(lock, 5ms);
  }
  return {};
}

void FetchImpl::decode(uint32_t i, uint32_t buffer, size_t len, GpuWorker* gpu) {
  Status st = over();
  {
    std::lock_guard lock(mu_);
    timings_[i].decode_start = Clock::now();
  }
  if (st.ok()) {
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(p_.buffers_[buffer].data()), len);
    const void* landed = nullptr;
    if (!p_.device_buffers_.empty()) {
      // GPUDirect: the chunk is in device memory; its host copy is what the decoder
      // checks (header, checksums, framing) before decoding it where it lies.
      landed = p_.device_buffers_[buffer].data();
      st = gpu::copy_to_host(p_.buffers_[buffer].data(), landed, len, p_.cfg_.gpu_device);
    }
    if (st.ok()) st = gpu ? decode_gpu(i, bytes, *gpu, landed) : decode_cpu(i, bytes);
    if (st.ok() && req_.keep_bytes) {
      std::vector<uint8_t> copy(bytes.begin(), bytes.end());
      std::lock_guard lock(mu_);
      kept_.resize(req_.chunks.size());
      kept_[i] = std::move(copy);
    }
  }
  {
    std::lock_guard lock(mu_);
    timings_[i].decode_end = Clock::now();
  }
  // After decode_gpu returned, the worker's stream is idle: the upload from this
  // buffer is complete, so it may take the next chunk.
  p_.release(buffer);
  finish(i, st.ok() ? st : st.with_context(fmt::format("chunk {}", i)));
}

Status FetchImpl::decode_cpu(uint32_t i, std::span<const uint8_t> bytes) {
  thread_local codec::DecodeScratch scratch;  // one per decode worker, reused across chunks
  auto view = req_.destination.slice(req_.chunks[i]);
  if (!view.ok()) return view.status();
  KVS_RETURN_IF_ERROR(codec::decode_chunk(p_.profile_, bytes, *view, &scratch));
  // The chunk's own header says which tokens it holds: they must be these.
  auto info = codec::inspect_chunk(bytes);
  if (info.ok() && info->tokens != req_.chunks[i].size())
    return make_status(StatusCode::corrupt_data, "chunk {} holds {} tokens, expected {}", i, info->tokens,
                       req_.chunks[i].size());
  return {};
}

Status FetchImpl::decode_gpu(uint32_t i, std::span<const uint8_t> bytes, GpuWorker& gpu, const void* landed) {
  // Checked before decoding here: the GPU writes as many tokens as the chunk holds, and
  // the runtime's device memory for chunk i holds exactly the range's tokens.
  KVS_ASSIGN_OR_RETURN(const codec::ChunkInfo info, codec::inspect_chunk(bytes));
  if (info.tokens != req_.chunks[i].size())
    return make_status(StatusCode::corrupt_data, "chunk {} holds {} tokens, expected {}", i, info.tokens,
                       req_.chunks[i].size());
  auto to_device = [&](const KvView& view) {
    return landed ? gpu.decoder->decode_landed(bytes, landed, view, gpu.stream.handle())
                  : gpu.decoder->decode(bytes, view, gpu.stream.handle());
  };
  if (!req_.device.empty()) {
    KVS_ASSIGN_OR_RETURN(const KvView packed, KvView::packed(req_.device.chunks[i], req_.device.dtype,
                                                             p_.profile_.geometry(), req_.chunks[i].size(),
                                                             info.first_position));
    return to_device(packed);
  }
  auto view = req_.destination.slice(req_.chunks[i]);
  if (!view.ok()) return view.status();
  if (req_.destination_memory == transport::MemoryType::cuda) return to_device(*view);
  return gpu.decoder->decode_to_host(bytes, *view);
}

void FetchImpl::finish(uint32_t i, Status st) {
  ChunkTimings t;
  {
    std::lock_guard lock(mu_);
    timings_[i].status = st;
    timings_[i].delivered = Clock::now();
    t = timings_[i];
  }
  if (cb_.on_chunk) cb_.on_chunk(t);
  {
    std::lock_guard lock(mu_);
    if (!st.ok() && first_error_.ok()) first_error_ = st;
    --remaining_;
  }
  done_cv_.notify_all();
}

}  // namespace

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
  auto p = std::make_unique<PipelineImpl>(client, profile, config);
  KVS_RETURN_IF_ERROR(p->init());
  return std::unique_ptr<Pipeline>(std::move(p));
}

}  // namespace kvstream::pipeline

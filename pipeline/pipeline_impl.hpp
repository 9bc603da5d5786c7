// The pipeline behind Pipeline::create (include/kvstream/pipeline.hpp): its receive
// buffers and decode workers (pipeline.cpp), the GPU decode path and GPUDirect's
// device buffers (pipeline_gpu.cpp), and one fetch's dispatcher and decodes
// (fetch.cpp).
//
// A dispatcher thread per fetch walks the chunks in order: it takes a free receive
// buffer (back-pressure: at most `depth` chunks are on the wire or waiting to decode),
// waits until fewer than `max_on_wire` transfers are outstanding, asks the decision
// callback, and issues the get. When a chunk's bytes land, a decode worker decodes it
// straight from that buffer into the runtime's memory and returns the buffer. So chunk
// i+1.. travel while chunk i decodes.
//
// On the GPU path (PipelineConfig::decode) the receive buffers are also page-locked
// and each decode worker owns a GpuDecoder and a CUDA stream: a landed chunk is
// uploaded by DMA from its buffer and decoded on that worker's stream, into device
// memory (FetchRequest::device) or, for a host destination, copied back.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvstream/gpu.hpp"
#include "kvstream/gpu_decoder.hpp"
#include "kvstream/gpu_resources.hpp"
#include "kvstream/pipeline.hpp"

namespace kvstream::pipeline::detail {

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
  ~PipelineImpl() override;

  // Checks the configuration, makes (and registers) the receive buffers, chooses where
  // decode runs and starts the workers.
  Status init();

  DecodeOn decodes_on() const override { return decodes_on_; }
  const codec::Profile& profile() const override { return profile_; }

  Result<std::shared_ptr<Fetch>> fetch(FetchRequest req, FetchCallbacks cb) override;

  uint32_t buffers_in_use() const override;

  // Takes a free buffer, waiting while all are lent (back-pressure).
  Result<uint32_t> acquire(transport::Deadline deadline, const transport::CancelToken& cancel);
  void release(uint32_t b);
  // Queues chunk `chunk` of `f`, landed in `buffer`, for a decode worker.
  void submit_decode(std::shared_ptr<FetchImpl> f, uint32_t chunk, uint32_t buffer, size_t len);

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
  Status check_gpudirect() const;

  // GPUDirect's receive buffers: device memory of gpu_device, registered with the
  // client's backend as MemoryType::cuda, one per buffer slot.
  Status start_gpudirect();

  // Resolves cfg_.decode: on the GPU path, one decoder and one stream per worker, and
  // the receive buffers page-locked so that uploads are DMA from where chunks land.
  Status choose_decode();

  // The GPU path's workers (a decoder and a stream each) and page-locked buffers.
  Status start_gpu();

  // A device destination (FetchRequest::device): a GPU pipeline, a pointer per chunk on
  // its device, an element type the kernels write.
  Status check_device_destination(const FetchRequest& req) const;

  // A destination view in device memory: only a GPU pipeline writes there, and every
  // plane must be memory of its device (a host pointer would fault in the kernel).
  Status check_device_view(const FetchRequest& req) const;

  // A decode worker: takes landed chunks until the pipeline stops.
  void work(GpuWorker* gpu);
};

}  // namespace kvstream::pipeline::detail

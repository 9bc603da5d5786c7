// RAII pieces of the GPU path: device memory, page-locked host memory, CUDA streams
// and events, and
// synchronous copies between host and device memory. What the pipeline's GPU decode
// path (pipeline.hpp, PipelineConfig::decode) is made of, usable on their own by a
// runtime that wants the same.
//
// No CUDA types appear here (handles are void*), so callers build without the CUDA
// headers. Every factory first asks gpu::probe_device(): without CUDA in the build
// it fails `unsupported`, without a usable GPU (no driver: cudaErrorInsufficientDriver,
// 35) `unavailable` with the CUDA error named; nothing here crashes or throws for want
// of a GPU. Destructors release what was acquired (free, unregister, destroy) and
// ignore errors: there is nothing a caller could do about them.
#pragma once

#include <cstddef>
#include <functional>
#include <cstdint>

#include "kvstream/status.hpp"

namespace kvstream::gpu {

/// Owned device memory (cudaMalloc / cudaFree) on one device, e.g. for
/// GpuDecoder::decode's output.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  /// Allocates `bytes` (at least 1) on `device`. Errors: unsupported, unavailable
  /// (see above), resource_exhausted.
  static Result<DeviceBuffer> allocate(uint64_t bytes, int device = 0);
  [[nodiscard]] void* data() const noexcept { return p_; }
  [[nodiscard]] uint64_t size() const noexcept { return n_; }

 private:
  void* p_ = nullptr;
  uint64_t n_ = 0;
  int device_ = 0;
};

/// Page-locked host memory: either allocated here (cudaHostAlloc, freed on
/// destruction) or an existing range registered (cudaHostRegister, unregistered on
/// destruction; the range itself stays the caller's). Copies from it to the device
/// are true asynchronous DMA; from ordinary (pageable) memory the driver stages them.
class PinnedHostMemory {
 public:
  PinnedHostMemory() = default;
  ~PinnedHostMemory();
  PinnedHostMemory(PinnedHostMemory&& o) noexcept;
  PinnedHostMemory& operator=(PinnedHostMemory&& o) noexcept;
  PinnedHostMemory(const PinnedHostMemory&) = delete;
  PinnedHostMemory& operator=(const PinnedHostMemory&) = delete;

  /// Allocates `bytes` (at least 1) of page-locked memory. Errors: unsupported,
  /// unavailable (see above), resource_exhausted.
  static Result<PinnedHostMemory> allocate(size_t bytes);
  /// Page-locks [data, data + bytes) in place. The range must stay allocated until
  /// this object is destroyed, and may not be registered twice. Errors: unsupported,
  /// unavailable, invalid_argument (null or empty range, already registered).
  static Result<PinnedHostMemory> register_range(void* data, size_t bytes);

  [[nodiscard]] void* data() const noexcept { return p_; }
  [[nodiscard]] size_t size() const noexcept { return n_; }
  /// True for register_range() (the memory is the caller's), false for allocate().
  [[nodiscard]] bool registered() const noexcept { return registered_; }

 private:
  void reset() noexcept;
  void* p_ = nullptr;
  size_t n_ = 0;
  bool registered_ = false;
};

/// A CUDA stream on one device (non-blocking with respect to the legacy default
/// stream, so work on it overlaps other streams' work). Destroyed on destruction.
class Stream {
 public:
  Stream() = default;
  ~Stream();
  Stream(Stream&& o) noexcept;
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  /// Creates a stream on `device`. Errors: unsupported, unavailable (also for a bad
  /// device index).
  static Result<Stream> create(int device = 0);
  /// The cudaStream_t, for GpuDecoder::decode and the CUDA runtime; null when empty.
  [[nodiscard]] void* handle() const noexcept { return s_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  /// Waits until everything enqueued so far has finished. Errors: unavailable (the
  /// CUDA error of the failed work, named).
  Status synchronize() const;

 private:
  void* s_ = nullptr;
  int device_ = 0;
};

/// A CUDA event on one device: marks a point in a stream, to wait for or to time.
class Event {
 public:
  Event() = default;
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  /// Creates an event on `device`; `timing` = false makes it cheaper (no
  /// elapsed_ms). Errors: unsupported, unavailable.
  static Result<Event> create(int device = 0, bool timing = true);
  /// Marks the point after everything enqueued on `stream` so far.
  Status record(const Stream& stream);
  /// Waits until the recorded point is reached.
  Status synchronize() const;
  /// Milliseconds from `start`'s point to this one (both recorded, both reached,
  /// both created with timing). Errors: unavailable, invalid_argument.
  [[nodiscard]] Result<float> elapsed_ms(const Event& start) const;
  [[nodiscard]] void* handle() const noexcept { return e_; }

 private:
  void* e_ = nullptr;
  int device_ = 0;
};

/// An instantiated CUDA graph: work captured once from a stream, launched again as
/// one unit (how runtimes replay a step without per-kernel launch costs).
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// Captures what `work` enqueues on `stream` (thread-local capture mode, so other
  /// threads' CUDA calls are unaffected) and instantiates it. A `work` that fails, or
  /// a capture CUDA refuses (a synchronizing call inside it), ends the capture and is
  /// returned. Errors: unsupported, unavailable, and those of `work`.
  static Result<Graph> capture(const Stream& stream, const std::function<Status()>& work);
  /// Enqueues the whole graph on `stream`. Errors: invalid_argument (empty), unavailable.
  Status launch(const Stream& stream) const;

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  int device_ = 0;
};

/// Copies `bytes` from device memory to host memory and waits for the copy. Errors:
/// unsupported, unavailable (the CUDA error named, e.g. a bad pointer).
Status copy_to_host(void* host_dst, const void* device_src, size_t bytes, int device = 0);
/// Copies `bytes` from host memory to device memory and waits for the copy. Errors:
/// as copy_to_host.
Status copy_to_device(void* device_dst, const void* host_src, size_t bytes, int device = 0);

/// Checks that `p` points into device memory of `device` (cudaMalloc, cudaMallocAsync
/// pools, or managed memory), so that a runtime's wrong pointer is an error here and
/// not an illegal-address fault that ruins the CUDA context for every user of the
/// device. Errors: unsupported, unavailable, invalid_argument (host memory, another
/// device, null).
Status check_device_pointer(const void* p, int device = 0);

}  // namespace kvstream::gpu

// Device and page-locked host buffers that grow on demand, for the GPU decoder's host
// code. CUDA builds only. Internal to gpu/.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string_view>

#include "gpu/cuda_error.hpp"
#include "kvstream/gpu.hpp"
#include "kvstream/gpu_resources.hpp"
#include "kvstream/status.hpp"

namespace kvstream::gpu::detail {

// Device memory that grows on demand (contents are not kept across growth), over the
// public DeviceBuffer, on the calling thread's current device (the decoder selects it).
class DevBuf {
 public:
  Status reserve(size_t n, std::string_view what) {
    if (n <= buf_.size() && buf_.data()) return {};
    int device = 0;
    KVS_CUDA(cudaGetDevice(&device), "cudaGetDevice");
    buf_ = DeviceBuffer();  // free before allocating the larger one
    auto b = DeviceBuffer::allocate(std::max<size_t>(n, 256), device);
    if (!b.ok()) return b.status().with_context(fmt::format("device memory for {}", what));
    buf_ = std::move(b).value();
    return {};
  }
  Status upload(const void* src, size_t n, std::string_view what) {
    KVS_RETURN_IF_ERROR(reserve(n, what));
    if (n) KVS_CUDA(cudaMemcpy(buf_.data(), src, n, cudaMemcpyHostToDevice), fmt::format("upload of {}", what));
    return {};
  }
  template <typename T>
  [[nodiscard]] T* as() const noexcept {
    return static_cast<T*>(buf_.data());
  }

 private:
  DeviceBuffer buf_;
};

// Page-locked host memory (fast, truly asynchronous copies) that grows on demand, over
// the public PinnedHostMemory.
class PinnedBuf {
 public:
  Status reserve(size_t n) {
    if (n <= mem_.size() && mem_.data()) return {};
    const size_t want = std::max<size_t>(n + n / 4, 4096);  // some headroom: chunks vary in size
    mem_ = PinnedHostMemory();
    KVS_ASSIGN_OR_RETURN(mem_, PinnedHostMemory::allocate(want));
    return {};
  }
  [[nodiscard]] uint8_t* data() const noexcept { return static_cast<uint8_t*>(mem_.data()); }

 private:
  PinnedHostMemory mem_;
};

inline cudaStream_t cuda_stream(const Stream& s) { return static_cast<cudaStream_t>(s.handle()); }
inline cudaEvent_t cuda_event(const Event& e) { return static_cast<cudaEvent_t>(e.handle()); }

// Milliseconds between two reached events; 0 when CUDA cannot tell (timings only).
inline float elapsed(const Event& a, const Event& b) {
  auto ms = b.elapsed_ms(a);
  return ms.ok() ? *ms : 0.0f;
}

inline size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// True when `p` lies in page-locked host memory (cudaHostAlloc, or a range that
// cudaHostRegister covers), from which an upload is DMA without a staging copy.
inline bool page_locked(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // not sticky; cleared so that the next call does not see it
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

}  // namespace kvstream::gpu::detail

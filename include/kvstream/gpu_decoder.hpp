// GPU decoding of codec chunk bitstreams (docs/bitstream.md), bit-exact with the CPU
// decoder (codec::decode_chunk) for every level, element type and geometry.
//
// The header and every substream are parsed and checked on the host with the CPU
// decoder's rules (same errors for the same defects); the entropy decoding (one warp
// per coded matrix, one lane per rANS state) and the reconstruction (dequantize,
// outliers, KLT, exact values, RoPE, rounding to the output type) run on the GPU.
//
// Availability: without CUDA in the build, create() fails with `unsupported`; with
// CUDA but without a usable device (no driver: cudaErrorInsufficientDriver, 35) with
// `unavailable`. gpu::probe_device() logs the reason once; callers then take the CPU
// path (codec::decode_chunk).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "kvstream/codec.hpp"
#include "kvstream/dtype.hpp"
#include "kvstream/kv_model.hpp"
#include "kvstream/gpu_resources.hpp"
#include "kvstream/status.hpp"

namespace kvstream::gpu {

/// Timings of the last decode (milliseconds, measured with CUDA events on the stream).
struct DecodeTimings {
  float upload_ms = 0;       ///< chunk bytes and descriptors, host -> device
  float entropy_ms = 0;      ///< rANS kernel
  float reconstruct_ms = 0;  ///< dequantize / KLT / RoPE / convert kernel
};

/// Host -> device copy bandwidth of `bytes` bytes (GB/s = 1e9 bytes/s, best of `reps`):
/// from page-locked memory and from ordinary (pageable) memory. Errors as DeviceBuffer.
struct CopyBandwidth {
  double pinned_gbps = 0;
  double pageable_gbps = 0;
};
Result<CopyBandwidth> measure_h2d_bandwidth(uint64_t bytes, int reps = 5, int device = 0);

/// Decodes chunks of one codec profile on one GPU. Owns its device memory (profile
/// constants, per-level decode tables, uploaded once each and cached; per-chunk
/// buffers, grown on demand and reused) and a pinned staging buffer. Not thread-safe:
/// one decode at a time per object (calls are serialized by an internal mutex);
/// use one decoder per thread for concurrency.
class GpuDecoder {
 public:
  /// Copies the profile's constants to `device` (levels' tables follow lazily, on the
  /// first chunk of each level). Errors: unsupported (built without CUDA, or a
  /// geometry too wide for the kernels' shared memory), unavailable (no usable GPU,
  /// bad device index), resource_exhausted (device memory).
  static Result<std::unique_ptr<GpuDecoder>> create(const codec::Profile& profile, int device = 0);

  ~GpuDecoder();
  GpuDecoder(const GpuDecoder&) = delete;
  GpuDecoder& operator=(const GpuDecoder&) = delete;

  /// The profile this decoder serves (a copy owned by the decoder).
  [[nodiscard]] const codec::Profile& profile() const noexcept;
  /// The CUDA device index.
  [[nodiscard]] int device() const noexcept;

  /// Bytes of the packed output of a chunk of `tokens` tokens: layers x planes x
  /// tokens x channels elements of `dtype`.
  [[nodiscard]] static uint64_t output_bytes(const KvGeometry& g, uint64_t tokens, DType dtype) noexcept;

  /// Decodes `chunk` into `device_out` (device memory, `device_out_bytes` bytes, at
  /// least output_bytes(...)) as packed [layer][plane][token][channel] of `dtype`.
  /// Work is enqueued on `stream` (a cudaStream_t, e.g. gpu::Stream::handle();
  /// nullptr = the legacy default stream); the call returns after that stream has
  /// finished the decode, because the rANS checks (word count, escapes, final states)
  /// are read back before reporting success. When `chunk` lies in page-locked memory
  /// (gpu::PinnedHostMemory, cudaHostRegister), its bytes are uploaded straight from
  /// there (DMA); otherwise they are first copied into the decoder's pinned staging
  /// buffer. Errors: corrupt_data (any defect codec::decode_chunk rejects),
  /// invalid_argument (another profile, null/short output), unavailable (a CUDA error;
  /// the message names it). On error the output's content is unspecified.
  Status decode(std::span<const uint8_t> chunk, void* device_out, uint64_t device_out_bytes, DType dtype,
                void* stream = nullptr);

  /// Decodes into a host KV view (any layout and dtype of kv_model.hpp) through a
  /// device buffer owned by the decoder: the conversion to out.dtype() happens on the
  /// GPU, the rows are then copied into `out`. For tests and tools. Errors: those of
  /// decode(), and invalid_argument when the view's geometry or token count differs
  /// from the chunk's.
  Status decode_to_host(std::span<const uint8_t> chunk, const KvView& out);

  /// Timings of the last successful decode.
  [[nodiscard]] DecodeTimings last_timings() const noexcept;

 private:
  struct Impl;
  explicit GpuDecoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvstream::gpu

// GPU decoding of codec chunk bitstreams (docs/bitstream.md), bit-exact with the CPU
// decoder (codec::decode_chunk) for every level, element type and geometry, for
// single-level chunks and for any prefix of a progressive stream (its refinement
// layers: per-symbol tables from the coarser indices, the indices refined on the
// device, the recent rows a layer finer).
//
// The header and every substream are parsed and checked on the host with the CPU
// decoder's rules (same errors for the same defects); the entropy decoding (one warp
// per coded matrix, one lane per rANS state) and the reconstruction (dequantize,
// outliers, KLT, exact values, RoPE, rounding to the output type) run on the GPU and
// write each element where the destination view puts it (packed, strided, or a
// runtime's paged blocks). The rANS checks that need the decode run on the device too;
// their verdict comes back by a synchronous return (decode) or, stream-ordered, by a
// callback after the decode (enqueue).
//
// Availability: without CUDA in the build, create() fails with `unsupported`; with
// CUDA but without a usable device (no driver: cudaErrorInsufficientDriver, 35) with
// `unavailable`. gpu::probe_device() logs the reason once; callers then take the CPU
// path (codec::decode_chunk).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <functional>
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

/// The verdict of a decode enqueued with GpuDecoder::enqueue: `tag` is the caller's
/// (e.g. the chunk's index in its context), `status` ok or the error that makes the
/// chunk's KV unusable (corrupt_data naming the failing (layer, plane), unavailable for
/// a CUDA error). Called once per enqueued decode, on a thread of the CUDA runtime:
/// it must not call CUDA and should return quickly (hand the verdict to a queue).
using DecodeDone = std::function<void(uint64_t tag, const Status& status)>;

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
  /// finished the decode, because the device's verdict on the rANS checks (word count,
  /// escapes, final states) is read back before reporting success (enqueue() below
  /// does not wait). When `chunk` lies in page-locked memory
  /// (gpu::PinnedHostMemory, cudaHostRegister), its bytes are uploaded straight from
  /// there (DMA); otherwise they are first copied into the decoder's pinned staging
  /// buffer. Errors: corrupt_data (any defect codec::decode_chunk rejects),
  /// invalid_argument (another profile, null/short output), unavailable (a CUDA error;
  /// the message names it). On error the output's content is unspecified.
  Status decode(std::span<const uint8_t> chunk, void* device_out, uint64_t device_out_bytes, DType dtype,
                void* stream = nullptr);

  /// Decodes `chunk` into `device_out`: a view over memory of this decoder's device,
  /// packed, strided or paged (KvView::paged with device pointers in its layout, e.g.
  /// vLLM's per-layer K and V block tensors and the sequence's block table, NHD or
  /// HND). The reconstruction kernel writes every element where the view puts it: no
  /// packed intermediate, no scatter pass. Synchronous: returns after `stream` has
  /// finished the decode and its integrity verdict. Errors: those of decode() above;
  /// invalid_argument when the view's geometry or token count differs from the chunk's,
  /// or a plane of it is not device memory of this device.
  Status decode(std::span<const uint8_t> chunk, const KvView& device_out, void* stream = nullptr);

  /// Decodes in flight per decoder; enqueue() waits for the oldest beyond this.
  static constexpr unsigned kMaxInFlight = 4;

  /// Stream-ordered decode: enqueues the upload, the kernels and the device-side
  /// integrity check of `chunk` into `device_out` (as decode(chunk, view, stream)) on
  /// `stream`, and returns without waiting for the GPU, so that a runtime queues the
  /// decode behind its own work. The host first checks everything that needs no entropy
  /// decoding (header, profile, checksums, framing): such errors are returned here and
  /// nothing is enqueued. The rANS checks run on the device; `done(tag, status)` gets
  /// their verdict once the decode has finished in stream order, and work the caller
  /// enqueues on `stream` afterwards (an event it records, a kernel reading the KV) runs
  /// after the decode. A chunk that fails is reported by its tag, never silently used.
  /// `chunk` must stay unchanged until `done` runs (page-locked chunks are copied from
  /// where they lie). The decode's buffers come from a ring of kMaxInFlight; the call
  /// blocks only when all are in flight. Inside a CUDA graph capture of `stream` the
  /// decode is captured (buffers of its own, kept for the graph; replaying the graph
  /// decodes the same chunk bytes into the same view): call load_levels() before
  /// capturing. Errors: as decode(); invalid_argument for a capture needing a level
  /// not loaded yet.
  Status enqueue(std::span<const uint8_t> chunk, const KvView& device_out, void* stream, uint64_t tag,
                 DecodeDone done);

  /// GPUDirect: decodes a chunk that landed in device memory (`device_chunk`, e.g. a
  /// receive buffer registered with the transport as MemoryType::cuda), reading it
  /// where it lies; `host_copy` holds the same bytes on the host, where the header,
  /// checksums and framing are checked before anything runs (the rANS checks run on the
  /// device, as always). Synchronous. Errors: as decode(); invalid_argument when
  /// `device_chunk` is not memory of this device.
  Status decode_landed(std::span<const uint8_t> host_copy, const void* device_chunk, const KvView& device_out,
                       void* stream = nullptr);

  /// Upgrades KV decoded on the GPU from `kept` (a prefix of a progressive stream, as
  /// fetched for the first token) in place to the longer prefix `kept` + `more` (the
  /// bytes fetched since, from a substream boundary): bit for bit what decode() gives on
  /// the longer prefix, as codec::refine_chunk on the CPU. Synchronous. Errors: as
  /// decode(); invalid_argument when `kept` is not a progressive prefix.
  Status refine(std::span<const uint8_t> kept, std::span<const uint8_t> more, const KvView& device_out,
                void* stream = nullptr);

  /// Uploads every level's decode tables now (they are otherwise uploaded on each
  /// level's first chunk, with a synchronous copy that a graph capture cannot hold).
  Status load_levels();

  /// Decodes into a host KV view (any layout and dtype of kv_model.hpp) through a
  /// device buffer owned by the decoder: the conversion to out.dtype() happens on the
  /// GPU, the rows are then copied into `out`. For tests and tools. Errors: those of
  /// decode(), and invalid_argument when the view's geometry or token count differs
  /// from the chunk's.
  Status decode_to_host(std::span<const uint8_t> chunk, const KvView& out);

  /// Timings of the last successful synchronous decode (decode(), decode_to_host()).
  [[nodiscard]] DecodeTimings last_timings() const noexcept;

 private:
  struct Impl;
  explicit GpuDecoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvstream::gpu

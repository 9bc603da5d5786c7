// The streaming pipeline: fetches a context's encoded chunks from a storage node and
// decodes them into the runtime's KV memory, keeping chunk i+1.. on the wire while
// chunk i decodes. Buffers are registered once and reused; memory held is bounded by
// depth x max chunk size, whatever the context length.
//
// Chunks decode on the CPU (codec::decode_chunk, the default) or on a GPU
// (gpu::GpuDecoder; PipelineConfig::decode). On the GPU path the receive buffers are
// also page-locked (cudaHostRegister), so a landed chunk is uploaded by DMA straight
// from the buffer it landed in, and each decode worker owns one GpuDecoder and one
// CUDA stream: with decode_threads >= 2, the upload and decode of chunk i on one
// worker's stream overlap the decode of chunk i-1 on another's, while chunk i+1.. are
// on the wire. The runtime's KV memory may then be on the GPU (FetchRequest::device).
// GPUDirect (chunks landing straight in device memory) needs a transport backend that
// declares Capabilities::cuda_memory (UCX built with CUDA transports does; tcp does
// not, nor do the UCX and libfabric builds here). Every storage client reports its
// backend's capabilities through its wrappers (paced, replicated; Redis reports host
// memory only), and the check names the backend; the GPUDirect receive path itself is
// not built yet, so even a backend that declares cuda memory gets `unsupported`.
//
// With a progressive profile (codec::Profile::progressive) each chunk is stored as
// one object, level 0 of its stored chunk, whose parts (storage::ObjectPart) are the
// ends of its levels' prefixes, coarsest first; fetching a chunk at level L is a range
// get of that prefix, and refine_fetch later fetches only the bytes from L's end to a
// finer level's and upgrades the KV in place.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvstream/codec.hpp"
#include "kvstream/dtype.hpp"
#include "kvstream/kv_model.hpp"
#include "kvstream/status.hpp"
#include "kvstream/storage.hpp"
#include "kvstream/transport.hpp"

namespace kvstream::pipeline {

using transport::Clock;

/// What to do with one chunk: fetch it at a level, or let the runtime recompute it
/// from text (the chunk is then only reported).
struct ChunkDecision {
  enum class Action : uint8_t { fetch, recompute } action = Action::fetch;
  uint32_t level = 0;
};

/// Where one chunk's time went (steady clock; unset stages stay at the epoch).
struct ChunkTimings {
  uint32_t chunk = 0;
  ChunkDecision decision;
  uint64_t bytes = 0;                 ///< encoded bytes fetched
  Clock::time_point queued;           ///< decided and waiting for a buffer
  Clock::time_point wire_start;       ///< request sent
  Clock::time_point wire_end;         ///< bytes landed and verified
  Clock::time_point decode_start;
  Clock::time_point decode_end;       ///< decoded into runtime memory
  Clock::time_point delivered;        ///< on_chunk called
  Status status;                      ///< ok, or why this chunk failed
};

/// Where chunks are decoded.
enum class DecodeOn : uint8_t {
  cpu,        ///< codec::decode_chunk on the decode threads (what the pipeline always did)
  gpu,        ///< gpu::GpuDecoder on PipelineConfig::gpu_device; create() fails when that GPU is not usable
  automatic,  ///< the GPU when gpu::probe_device() finds one and a decoder starts on it, else the CPU
};

/// "cpu", "gpu" or "auto".
std::string_view decode_on_name(DecodeOn d) noexcept;
/// Parses "cpu", "gpu" or "auto". Errors: invalid_argument.
Result<DecodeOn> parse_decode_on(std::string_view name);

/// Pipeline settings (defaults documented per field). New fields go at the end, so
/// that aggregate initialisation ({depth, max_chunk_bytes, decode_threads}) keeps
/// meaning what it meant.
struct PipelineConfig {
  uint32_t depth = 4;                 ///< receive buffers, i.e. chunks on the wire or waiting to decode
  uint64_t max_chunk_bytes = uint64_t(64) << 20;  ///< size of each receive buffer
  unsigned decode_threads = 1;        ///< decoders working on different chunks at once (on the GPU path:
                                      ///< GpuDecoders, each with its own stream; >= 2 to overlap chunks)
  DecodeOn decode = DecodeOn::cpu;    ///< where chunks decode; create() logs which path it took
  int gpu_device = 0;                 ///< the CUDA device of DecodeOn::gpu (and of automatic)
  /// Land encoded chunks straight in device memory (GPUDirect) instead of in pinned
  /// host buffers. Needs the client's backend to declare Capabilities::cuda_memory
  /// (storage::Client::capabilities); the receive path is not built yet, so create()
  /// fails `unsupported`, naming the backend or, where it declares cuda memory, the
  /// missing path.
  bool gpudirect = false;
  /// Transfers requested and not yet landed, at most (0: up to depth). The next chunk
  /// is decided only when it can go on the wire, so an adaptive decision uses the
  /// freshest throughput estimate. Default 2: the next request is already out while
  /// one lands, which hides the round trip.
  uint32_t max_on_wire = 2;
};

/// Runtime KV memory on the GPU: where a GPU pipeline (Pipeline::decodes_on() == gpu)
/// writes each decoded chunk instead of into FetchRequest::destination.
struct DeviceDestination {
  /// Chunk i is written to chunks[i] (device memory of PipelineConfig::gpu_device) as
  /// packed [layer][plane][token][channel] of `dtype` for the tokens of
  /// FetchRequest::chunks[i]: exactly gpu::GpuDecoder::output_bytes(profile geometry,
  /// chunks[i].size(), dtype) bytes, which the runtime must have allocated there.
  /// Pointers may be anywhere (one per chunk: a paged runtime's block of the chunk,
  /// or base + offset in one allocation). Empty = a host destination.
  std::vector<void*> chunks;
  DType dtype = DType::f16;           ///< element type written (f16, bf16 or f32)
  [[nodiscard]] bool empty() const noexcept { return chunks.empty(); }
};

/// One fetch: a context's chunks into a destination view, or into device memory.
struct FetchRequest {
  std::string context;
  /// Runtime KV memory for all the chunks (packed, strided or paged), in host memory,
  /// or in device memory when `destination_memory` says cuda. Unused (may be empty)
  /// when `device` is set. A GPU pipeline given a host destination decodes on the GPU
  /// and copies each chunk back (GpuDecoder::decode_to_host): a check path, not the
  /// fast one.
  KvView destination;
  /// Where `destination` lies. cuda: memory of PipelineConfig::gpu_device (a runtime's
  /// paged blocks, e.g. vLLM's per-layer K and V tensors with the sequence's block
  /// table): a GPU pipeline's decoder writes every chunk straight into it; a CPU
  /// pipeline refuses it (invalid_argument), as it refuses `device`.
  transport::MemoryType destination_memory = transport::MemoryType::host;
  std::vector<TokenRange> chunks;     ///< destination-relative token range of chunk i (stored as chunk i)
  /// Which stored chunk lands in range i (empty: chunk i). Lets a runtime fetch part of
  /// a stored context (a shared prefix, a window) or reuse stored chunks; each must
  /// hold as many tokens as its range.
  std::vector<uint32_t> stored_chunks;
  /// Which context range i is stored under (empty: `context` for every range). A
  /// token-prefix store (KvStore) keeps each chunk as a context of its own, named by
  /// the hash of its tokens and every token before them.
  std::vector<std::string> stored_contexts;
  /// The stored size of every level of range i's chunk, when the caller has just read
  /// them from the store (Client::stat); the pipeline then does not stat again, and
  /// FetchCallbacks::decide sees exactly these. Empty: the pipeline stats each context.
  std::vector<std::vector<uint64_t>> level_bytes;
  transport::Deadline deadline;       ///< the whole fetch
  transport::CancelToken cancel;
  /// Runtime KV memory on the GPU, one pointer per chunk (GPU pipelines only; a CPU
  /// pipeline refuses it with invalid_argument). When set, only the size of each
  /// chunk's range matters and `destination` is not touched.
  DeviceDestination device;
  /// Keep each delivered chunk's fetched bytes (host memory, the chunk's encoded size)
  /// for a later refine_fetch; Fetch::take_kept_bytes hands them over.
  bool keep_bytes = false;
};

struct FetchCallbacks {
  /// Chooses range i's level (or recompute) just before it is fetched, given the
  /// stored size of every level of the chunk stored for that range (after
  /// stored_contexts and stored_chunks). Default: level 0 everywhere.
  std::function<ChunkDecision(uint32_t chunk, std::span<const uint64_t> level_bytes)> decide;
  /// Called once per chunk, from a pipeline thread, the moment the chunk is in the
  /// runtime's memory (or is to be recomputed, or failed: see timings.status).
  std::function<void(const ChunkTimings&)> on_chunk;
};

/// The stored size of every level of each range's chunk, in range order (after
/// stored_contexts and stored_chunks): request.level_bytes when set, else one
/// Client::stat per context. A range whose chunk is not stored gets an empty entry.
/// Errors: the stat's (not_found for a context that does not exist).
/// The context and the stored chunk that range i of `request` comes from (after
/// stored_contexts and stored_chunks).
const std::string& stored_context(const FetchRequest& request, size_t i);
uint32_t stored_chunk(const FetchRequest& request, size_t i);

/// With `progressive`, the chunks are stored as a progressive profile stores them
/// (one object whose parts end its levels' prefixes) and a level's size is its
/// prefix's end. Errors: the stat's (not_found for a context that does not exist).
Result<std::vector<std::vector<uint64_t>>> range_level_bytes(storage::Client& client, const FetchRequest& request,
                                                            bool progressive = false);

/// The stored size of every level of one chunk from its stat: each level object's
/// size, or with `progressive` the end of each level's prefix (level i is part
/// n - 1 - i of level 0's object). Empty when the chunk is not stored in that form.
std::vector<uint64_t> stored_level_bytes(const storage::ChunkStat& stat, bool progressive);

/// A refinement of a finished fetch of progressive chunks: the same request (ranges,
/// contexts, destination in host or device memory) and the bytes the fetch kept,
/// brought to `level`.
struct RefineRequest {
  FetchRequest fetch;                       ///< as fetched (keep_bytes unused)
  std::vector<std::vector<uint8_t>> kept;   ///< per range: the prefix it holds (empty: skip the range); grows
  uint32_t level = 0;                       ///< the level to reach (0: the finest)
  /// Per range, the level it reaches (policy::kNotFetched: left as it is), e.g. a
  /// policy::plan_refinement; empty: `level` for every range.
  std::vector<uint32_t> levels;
  unsigned decode_threads = 1;              ///< host destinations; device KV is refined by one GpuDecoder
  int gpu_device = 0;                       ///< the CUDA device of a device destination (the fetch's gpu_device)
};

/// What a refinement did.
struct RefineReport {
  uint32_t chunks_refined = 0;   ///< chunks whose KV was upgraded
  uint64_t bytes = 0;            ///< bytes fetched (only what each kept prefix lacked)
};

/// Fetches, for every range whose kept prefix is shorter than `level`'s, the bytes
/// from its end to that level's end (one range get each, all in flight at once),
/// then upgrades the range's KV in the destination in place (bit for bit the decode of
/// the longer prefix: codec::refine_chunk in host memory; in device memory, `device` or
/// a view with destination_memory cuda, gpu::GpuDecoder::refine on `gpu_device`) and
/// appends the bytes to `kept`. A range already at or above the level is left as it
/// is. Errors: invalid_argument (not a progressive profile, sizes that do not match),
/// unsupported or unavailable (device KV without a usable GPU: returned before any
/// byte is fetched), and the client's and decoder's; on error ranges already refined
/// stay refined.
Result<RefineReport> refine_fetch(storage::Client& client, const codec::Profile& profile, RefineRequest& request);

/// An ongoing fetch.
class Fetch {
 public:
  virtual ~Fetch() = default;
  /// Waits until every chunk is delivered, reported or failed. Returns ok when every
  /// chunk was delivered or marked for recompute; otherwise the first failure (every
  /// chunk's own status is in timings()).
  virtual Status wait() = 0;
  /// Stops the fetch: chunks not yet delivered end with `cancelled`; buffers return to
  /// the pool before wait() returns.
  virtual void cancel() = 0;
  /// Per-chunk timings (complete after wait()).
  [[nodiscard]] virtual std::vector<ChunkTimings> timings() const = 0;
  /// With FetchRequest::keep_bytes, after wait(): each range's fetched bytes (empty
  /// for ranges recomputed or failed), moved out (a second call returns empties).
  virtual std::vector<std::vector<uint8_t>> take_kept_bytes() = 0;
};

/// Fetches and decodes. One pipeline serves one fetch at a time per call to fetch();
/// concurrent fetches share its buffers (each waits for free ones).
class Pipeline {
 public:
  virtual ~Pipeline() = default;
  /// `client` and `profile` must outlive the pipeline. Allocates and registers the
  /// receive buffers and starts the decode workers; logs the decode path taken (CPU,
  /// or which GPU). Errors: invalid_argument (config); with DecodeOn::gpu,
  /// `unavailable` when no GPU is usable (the message names the CUDA error, e.g. 35,
  /// cudaErrorInsufficientDriver) or `unsupported` (built without CUDA, geometry too
  /// wide for the kernels), never a silent fallback to the CPU; with
  /// DecodeOn::automatic the same causes only select the CPU (gpu::probe_device() logs
  /// why, once per process); with gpudirect, `unsupported` naming the client's
  /// backend; and the client's errors registering the buffers.
  static Result<std::unique_ptr<Pipeline>> create(storage::Client& client, const codec::Profile& profile,
                                                  const PipelineConfig& config);
  /// Starts a fetch. Errors before any transfer: invalid_argument (ranges outside the
  /// destination, geometry mismatch, a device destination on a CPU pipeline or with a
  /// pointer count other than the chunk count, a null or non-device pointer, an
  /// element type the GPU decoder cannot write), not_found (no such context), and the
  /// client's errors for its stat call.
  virtual Result<std::shared_ptr<Fetch>> fetch(FetchRequest request, FetchCallbacks callbacks) = 0;
  /// Buffers currently lent to fetches (0 when idle): the memory bound in action.
  [[nodiscard]] virtual uint32_t buffers_in_use() const = 0;
  /// Where this pipeline decodes: cpu or gpu (automatic resolved at create()).
  [[nodiscard]] virtual DecodeOn decodes_on() const = 0;
  /// The profile it decodes with.
  [[nodiscard]] virtual const codec::Profile& profile() const = 0;
};

}  // namespace kvstream::pipeline

// KvStore: the front door. One object owns the storage client (a node, a cluster or
// Redis), the codec profile, the fetch pipeline, the throughput estimators and the
// level chooser; runtimes talk to it in tokens.
//
// Keys. A context is cut into chunks of codec.chunk_tokens tokens; chunk i is stored
// under a name derived from the model id, the profile's hash and a chained hash of
// the tokens of chunks 0..i (so a chunk's key names everything its KV depends on).
// Two prompts that share a prefix share the keys of its whole chunks: the prefix is
// stored once, and either prompt finds it. Each chunk keeps every level of the codec
// and a small record (its token count, position and when it was stored), written
// last, so a chunk whose put was cut short is never found.
//
//   auto store = kvstream::KvStore::open(config);            // Result<KvStore>
//   store->put(tokens, kv.view(), deadline);                 // after prefill
//   uint64_t n = *store->lookup(tokens, deadline);           // later, another prompt
//   auto f = store->fetch(tokens, {.host = dest}, deadline); // adaptive, pipelined
//   auto report = f->wait();                                 // tokens [0, n) in dest
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvstream/codec.hpp"
#include "kvstream/kv_model.hpp"
#include "kvstream/pipeline.hpp"
#include "kvstream/status.hpp"
#include "kvstream/storage.hpp"
#include "kvstream/store_config.hpp"

namespace kvstream {

/// Token ids as the runtime's tokenizer gives them.
using Token = int32_t;

/// What put() did.
struct PutReport {
  uint32_t chunks = 0;          ///< whole chunks in the tokens given
  uint32_t already_stored = 0;  ///< of those, found stored (a shared prefix): not encoded again
  uint64_t bytes = 0;           ///< encoded bytes written (every level)
  uint64_t tokens = 0;          ///< tokens covered by stored chunks after the put (whole chunks)
  uint32_t evicted_chunks = 0;  ///< chunks removed to make room (eviction.when_full)
  uint64_t evicted_bytes = 0;   ///< their bytes
};

struct PutOptions {
  /// Encode and store even chunks that are found stored (replaces them).
  bool overwrite = false;
  transport::CancelToken cancel;
};

/// Where fetched KV goes: a view (packed, strided or paged) covering at least the
/// fetched tokens, token 0 of the view being position 0 of the prompt, in host memory
/// or in GPU memory; or device memory as one packed buffer per chunk (see
/// pipeline::DeviceDestination). Exactly one of the three is set.
struct FetchDestination {
  KvView host;
  /// The same kind of view over memory of PipelineSettings::gpu_device, e.g. vLLM's
  /// per-layer K and V block tensors with the sequence's block table
  /// (PagedLayout::blocks with device pointers): a store that decodes on the GPU writes
  /// every chunk straight into the runtime's blocks. A CPU store refuses it.
  KvView device_view;
  pipeline::DeviceDestination device;
};

struct FetchOptions {
  /// Fetch at most this many tokens (rounded down to whole chunks); 0: all stored.
  uint64_t max_tokens = 0;
  /// Every chunk at this level, no chooser (e.g. the near-lossless level 0).
  std::optional<uint32_t> level;
  /// How long past the deadline a late fetch may still complete. The chooser plans
  /// every chunk for the deadline; when the link is slower than predicted, the
  /// chunks still land until deadline + grace, after which the fetch fails
  /// timed_out (the runtime then recomputes from text). A TTFT target is a goal,
  /// not a reason to throw away KV that is a moment late.
  std::chrono::milliseconds grace{1000};
  /// Higher runs first when more fetches are queued than PipelineSettings::max_running.
  int priority = 0;
  /// Called per chunk, from a pipeline thread, once it is in the destination (or
  /// reported for recompute, or failed).
  std::function<void(const pipeline::ChunkTimings&)> on_chunk;
  transport::CancelToken cancel;
  /// Keep each fetched chunk's bytes (host memory, their encoded size) so that
  /// StoreFetch::refine can later upgrade the KV to a finer level by fetching only
  /// the bytes that level adds (progressive profiles).
  bool keep_for_refinement = false;
};

/// The outcome of a fetch.
struct FetchReport {
  uint64_t tokens = 0;                  ///< tokens [0, tokens) handled: in the destination or in `recompute`
  std::vector<TokenRange> recompute;    ///< ranges chosen as text: the runtime prefills them
  uint64_t bytes = 0;                   ///< encoded bytes fetched
  double mean_quality_loss_pct = 0;     ///< mean over fetched chunks of their loss (a progressive chunk's own estimate, else its level's)
  double max_quality_loss_pct = 0;
  std::vector<pipeline::ChunkTimings> chunks;
};

/// What a fetch is predicted to do if started now (admission).
struct FetchPlan {
  uint64_t tokens = 0;                  ///< tokens the fetch would cover (whole stored chunks)
  bool fits = false;                    ///< predicted done by the deadline
  double predicted_seconds = 0;         ///< until the last chunk is in memory, queueing included
  double mean_quality_loss_pct = 0;
  uint32_t recompute_chunks = 0;
  std::vector<pipeline::ChunkDecision> decisions;
};

/// A fetch in progress. Move-only; destroying it cancels and waits.
class StoreFetch {
 public:
  /// An empty handle (wait() fails invalid_argument) until a fetch is moved in.
  StoreFetch() = default;
  StoreFetch(StoreFetch&&) noexcept;
  StoreFetch& operator=(StoreFetch&&) noexcept;
  ~StoreFetch();
  /// Waits for the end. Errors: the first chunk's failure, timed_out, cancelled.
  Result<FetchReport> wait();
  /// Stops it; undelivered chunks end `cancelled`.
  void cancel();
  /// Tokens the fetch covers.
  [[nodiscard]] uint64_t tokens() const noexcept;
  /// After wait(), for a fetch with FetchOptions::keep_for_refinement from a store
  /// with a progressive profile: fetches, for each chunk it delivered, only the bytes
  /// from its level's end to `level`'s end and upgrades that chunk's KV in the
  /// destination in place, bit for bit as a fetch at `level` would have written it
  /// (chunks at `level` or finer, and recomputed ones, stay as they are). Host KV is
  /// upgraded by the CPU decoder, device KV (device_view, device) by a
  /// gpu::GpuDecoder on pipeline.gpu_device. May be called again for a finer level.
  /// Errors: invalid_argument (not waited or failed, nothing kept, a single-level
  /// profile), unavailable (device KV and the GPU no longer usable), and those of the
  /// transfer and the decoder.
  Result<pipeline::RefineReport> refine(uint32_t level, transport::Deadline deadline);
  /// As refine, with a level per chunk chosen within a time budget
  /// (policy::plan_refinement on the store's estimate of the link and each chunk's
  /// own quality): the upgrades that lower the quality loss most per second of
  /// transfer and decode, while all of them are predicted to take at most `budget`
  /// (e.g. the runtime's time for its first few tokens). Errors: as refine, and the
  /// planner's (invalid_argument for a negative budget).
  Result<pipeline::RefineReport> refine_within(std::chrono::duration<double> budget, transport::Deadline deadline);

  struct State;

 private:
  friend class KvStore;
  explicit StoreFetch(std::shared_ptr<State> s);
  std::shared_ptr<State> s_;
};

/// What evict() removed.
struct EvictReport {
  uint32_t chunks_removed = 0;
  uint64_t bytes_removed = 0;
  uint64_t bytes_kept = 0;
};

/// The front door. Thread-safe; move-only.
class KvStore {
 public:
  /// Connects to the storage, loads the profile, starts the pipeline. Errors:
  /// invalid_argument (config), the profile's errors, the client's (unavailable,
  /// permission_denied, timed_out).
  static Result<KvStore> open(const StoreConfig& config);
  KvStore(KvStore&&) noexcept;
  KvStore& operator=(KvStore&&) noexcept;
  ~KvStore();

  /// Stores the KV of `tokens` (kv holds tokens.size() tokens or more, token 0 at
  /// position 0; its geometry is the profile's): every whole chunk, at every level,
  /// skipping those found stored, and marks them all used. Durable when it returns ok. Errors: no_space (the
  /// storage has no room: a chunk stored before it stays; with eviction.when_full,
  /// only when removing every other chunk of this model and profile did not make
  /// room), the client's and the codec's.
  Result<PutReport> put(std::span<const Token> tokens, const KvView& kv, transport::Deadline deadline,
                        const PutOptions& options = {});
  /// How many leading tokens of `tokens` are stored (a multiple of chunk_tokens): one
  /// stat per chunk, up to 8 at a time, stopping at the first chunk not stored.
  Result<uint64_t> lookup(std::span<const Token> tokens, transport::Deadline deadline,
                          const transport::CancelToken& cancel = {});
  /// Predicts fetch(tokens, ..., deadline) without starting it. Errors: not_found
  /// (nothing stored), the stat's errors.
  Result<FetchPlan> plan(std::span<const Token> tokens, transport::Deadline deadline, const FetchOptions& options = {});
  /// Starts fetching the stored prefix of `tokens` into `destination`, each chunk at
  /// the level the chooser picks against `deadline` (or options.level). Errors before
  /// any transfer: not_found (no chunk stored), invalid_argument (destination), the
  /// client's errors. The stored prefix's chunks are marked used beside the transfer
  /// (one small request off the caller's path; the handle waits for it when it goes).
  Result<StoreFetch> fetch(std::span<const Token> tokens, const FetchDestination& destination,
                           transport::Deadline deadline, FetchOptions options = {});
  /// Removes the stored chunks of `tokens` (every whole chunk; others' prompts that
  /// share them lose them too). Returns how many were removed.
  Result<uint32_t> remove(std::span<const Token> tokens, transport::Deadline deadline);
  /// Removes chunks of this model and profile not used for longer than `max_age` (0:
  /// no bound), then, until at most `max_bytes` are kept (0: no bound), the least
  /// recently used first. put and fetch mark a prompt's chunks used (Client::touch:
  /// one stamp, each chunk its depth), and among chunks used at once the deepest go
  /// first, so that what stays is whole prefixes: a chunk is of use only with every
  /// chunk before it. Chunks without a mark (stored before marks, or on a node from
  /// before 2026-12-06, which keeps none) go before marked ones, the deepest first, the
  /// oldest among equally deep ones, by their records; a storage that keeps marks lists
  /// the rest in one usage listing (store/eviction.hpp).
  Result<EvictReport> evict(uint64_t max_bytes, std::chrono::seconds max_age, transport::Deadline deadline);

  [[nodiscard]] const StoreConfig& config() const noexcept;
  [[nodiscard]] const codec::Profile& profile() const noexcept;
  [[nodiscard]] const KvGeometry& geometry() const noexcept;
  [[nodiscard]] uint32_t chunk_tokens() const noexcept;
  /// The stored name of each whole chunk of `tokens` (for tools and tests).
  [[nodiscard]] std::vector<std::string> chunk_keys(std::span<const Token> tokens) const;
  /// The storage client (to share it, e.g. with a scheduler of the caller's own).
  [[nodiscard]] storage::Client& client() noexcept;

  struct Impl;

 private:
  explicit KvStore(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvstream

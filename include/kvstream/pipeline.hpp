// The streaming pipeline: fetches a context's encoded chunks from a storage node and
// decodes them into the runtime's KV memory, keeping chunk i+1.. on the wire while
// chunk i decodes. Buffers are registered once and reused; memory held is bounded by
// depth x max chunk size, whatever the context length.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvstream/codec.hpp"
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

/// Pipeline settings (defaults documented per field).
struct PipelineConfig {
  uint32_t depth = 4;                 ///< receive buffers, i.e. chunks on the wire or waiting to decode
  uint64_t max_chunk_bytes = uint64_t(64) << 20;  ///< size of each receive buffer
  unsigned decode_threads = 1;        ///< decoders working on different chunks at once
};

/// One fetch: a context's chunks into a destination view.
struct FetchRequest {
  std::string context;
  KvView destination;                 ///< runtime KV memory for all the chunks (packed or paged)
  std::vector<TokenRange> chunks;     ///< destination-relative token range of chunk i (stored as chunk i)
  transport::Deadline deadline;       ///< the whole fetch
  transport::CancelToken cancel;
};

struct FetchCallbacks {
  /// Chooses each chunk's level (or recompute) just before it is fetched, given the
  /// stored size of every level of that chunk. Default: level 0 everywhere.
  std::function<ChunkDecision(uint32_t chunk, std::span<const uint64_t> level_bytes)> decide;
  /// Called once per chunk, from a pipeline thread, the moment the chunk is in the
  /// runtime's memory (or is to be recomputed, or failed: see timings.status).
  std::function<void(const ChunkTimings&)> on_chunk;
};

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
};

/// Fetches and decodes. One pipeline serves one fetch at a time per call to fetch();
/// concurrent fetches share its buffers (each waits for free ones).
class Pipeline {
 public:
  virtual ~Pipeline() = default;
  /// `client` and `profile` must outlive the pipeline.
  static Result<std::unique_ptr<Pipeline>> create(storage::Client& client, const codec::Profile& profile,
                                                  const PipelineConfig& config);
  /// Starts a fetch. Errors before any transfer: invalid_argument (ranges outside the
  /// destination, geometry mismatch), not_found (no such context), and the client's
  /// errors for its stat call.
  virtual Result<std::shared_ptr<Fetch>> fetch(FetchRequest request, FetchCallbacks callbacks) = 0;
  /// Buffers currently lent to fetches (0 when idle): the memory bound in action.
  [[nodiscard]] virtual uint32_t buffers_in_use() const = 0;
};

}  // namespace kvstream::pipeline

// The policy plugged into the pipeline: each chunk's level (or text) is chosen by a
// chooser from the stored sizes, the measured quality and decode cost of each level,
// and the peer's throughput estimate; every finished transfer updates that estimate.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "kvstream/pipeline.hpp"
#include "kvstream/policy.hpp"

namespace kvstream::pipeline {

/// What the chooser needs besides the chunk sizes (which come from the node's stat).
struct AdaptivePlan {
  std::shared_ptr<const policy::Chooser> chooser;    ///< e.g. make_chooser("deadline")
  std::shared_ptr<policy::EstimatorSet> estimators;  ///< shared by fetches to the same peers
  std::string peer;                                  ///< the storage node's address
  std::vector<double> level_quality_loss;            ///< per level (e.g. the profile's ppl increase %)
  std::vector<double> decode_seconds_per_byte;       ///< per level, measured; empty: decode cost ignored
  /// The pipeline's decode threads (PipelineConfig::decode_threads): chunks decode side
  /// by side, each at decode_seconds_per_byte as measured with all of them busy.
  uint32_t decode_workers = 1;
  std::vector<uint64_t> chunk_tokens;                ///< per chunk, for recompute; empty: no text option
  /// Per chunk and level, the chunk's own quality loss (policy::ContextCosts::
  /// chunk_level_quality_loss); empty: level_quality_loss for every chunk.
  std::vector<std::vector<double>> chunk_level_quality_loss;
  double recompute_tokens_per_second = 0;            ///< the runtime's prefill rate; 0: no text option
  /// The clock decisions are made on (time left, backlogs). Empty (default):
  /// transport::Clock::now. Tests inject one so that a plan does not depend on how
  /// fast the machine runs; the pipeline's own timings stay on the real clock.
  std::function<Clock::time_point()> now;
};

/// When a chunk's bytes really started flowing. Requests are pipelined (depth of them
/// in flight) on one link, so a chunk's bytes flow only once the chunk before it has
/// landed; counting from the moment its request went out would add the wait behind
/// earlier chunks and make a link look up to depth x slower. One per fetch; thread-safe.
class WireClock {
 public:
  /// The start to give an estimator for a chunk that was requested at `requested` and
  /// landed at `landed`, given every chunk landed before on this fetch.
  Clock::time_point transfer_start(Clock::time_point requested, Clock::time_point landed);

 private:
  std::mutex mu_;
  Clock::time_point last_landed_{};
};

/// Decode seconds per level of one chunk: level_bytes[l] x seconds_per_byte[l] (0
/// past the end of seconds_per_byte).
std::vector<double> decode_costs(std::span<const uint64_t> level_bytes, std::span<const double> seconds_per_byte);

/// The chooser's view of a fetch under `plan`: the stored sizes per range and level,
/// the plan's losses (each chunk's own where `chunk_loss` has them), decode times from
/// its seconds per byte, its decode workers, and text for recompute when the plan has
/// a prefill rate and `chunk_tokens` is given. Not validated (ContextCosts::validate).
policy::ContextCosts plan_costs(const AdaptivePlan& plan, std::vector<std::vector<uint64_t>> level_bytes,
                                std::vector<std::vector<double>> chunk_loss, std::span<const uint64_t> chunk_tokens);

/// Callbacks for Pipeline::fetch that decide with `plan` against `deadline`, and feed
/// each chunk's wire time to the peer's estimator. `level_bytes` are the stored sizes
/// per range and level (range_level_bytes(client, request)): the chooser plans the
/// whole fetch from them. When the pipeline hands decide() other sizes for a range
/// (the store changed, or a table indexed by stored chunk), the pipeline's win: they
/// are those of the chunk it will fetch. `on_chunk` (optional) is called after.
/// Errors: invalid_argument for an inconsistent plan.
Result<FetchCallbacks> adaptive_callbacks(const AdaptivePlan& plan, std::vector<std::vector<uint64_t>> level_bytes,
                                          transport::Deadline deadline,
                                          std::function<void(const ChunkTimings&)> on_chunk = {});

}  // namespace kvstream::pipeline

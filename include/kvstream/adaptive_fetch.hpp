// The policy plugged into the pipeline: each chunk's level (or text) is chosen by a
// chooser from the stored sizes, the measured quality and decode cost of each level,
// and the peer's throughput estimate; every finished transfer updates that estimate.
#pragma once

#include <functional>
#include <memory>
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
  std::vector<uint64_t> chunk_tokens;                ///< per chunk, for recompute; empty: no text option
  double recompute_tokens_per_second = 0;            ///< the runtime's prefill rate; 0: no text option
};

/// Callbacks for Pipeline::fetch that decide with `plan` against `deadline`, and feed
/// each chunk's wire time to the peer's estimator. `level_bytes` are the stored sizes
/// per chunk and level (from Client::stat). `on_chunk` (optional) is called after.
/// Errors: invalid_argument for an inconsistent plan.
Result<FetchCallbacks> adaptive_callbacks(const AdaptivePlan& plan, std::vector<std::vector<uint64_t>> level_bytes,
                                          transport::Deadline deadline,
                                          std::function<void(const ChunkTimings&)> on_chunk = {});

}  // namespace kvstream::pipeline

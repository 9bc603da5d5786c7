// KvStore against the hand-assembled pipeline on the same chunks (kvstream-bench
// pipeline, its last table).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvstream/codec.hpp"
#include "kvstream/pipeline.hpp"
#include "kvstream/storage.hpp"

namespace kvstream::bench {

struct StoreComparison {
  const codec::Profile* profile = nullptr;
  std::vector<std::vector<uint8_t>> chunks;  ///< the context's chunks encoded at `level` (as stored under "bench-ctx")
  uint32_t level = 0;
  uint64_t tokens = 0;                       ///< of the context; only whole chunks are compared
  uint32_t chunk_tokens = 0;
  storage::ClientConfig client;              ///< the node both paths fetch from
  pipeline::PipelineConfig pipeline;         ///< CPU decode
  std::string directory;                     ///< scratch (the profile file)
  uint32_t reps = 5;
};

struct StoreVsPipeline {
  uint32_t chunks = 0;
  uint64_t store_bytes = 0, pipeline_bytes = 0;
  double store_s = 0, pipeline_s = 0;        ///< medians: KvStore lookup + fetch; the pipeline by hand
  double store_fetch_s = 0;                  ///< median of KvStore's fetch alone (after its lookup)
  std::vector<double> store_all_s, pipeline_all_s;
};

/// Fetches the whole chunks through KvStore (lookup + fetch) and through the pipeline
/// by hand, alternated `reps` times. Errors: the store's, the client's.
Result<StoreVsPipeline> compare_store_with_pipeline(const StoreComparison& in);

}  // namespace kvstream::bench

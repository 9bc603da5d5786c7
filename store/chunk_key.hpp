// Names of stored chunks: derived from the model, the codec profile and the tokens of
// the chunk and of every chunk before it (a chained hash, as LMCache keys chunks), so
// a chunk's name covers everything its KV depends on and a shared prefix shares names.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvstream/status.hpp"

namespace kvstream::store {

class ChunkKeyer {
 public:
  /// Errors: invalid_argument (model id not 1..64 of [A-Za-z0-9._-], chunk_tokens 0).
  static Result<ChunkKeyer> create(std::string model_id, uint64_t profile_hash, uint32_t chunk_tokens);
  /// The names of the whole chunks of `tokens`: "<model>.<profile hash>.<128-bit chain hash>",
  /// all valid storage context ids.
  [[nodiscard]] std::vector<std::string> keys(std::span<const int32_t> tokens) const;
  /// The prefix every name of this model and profile starts with.
  [[nodiscard]] const std::string& prefix() const noexcept { return prefix_; }
  [[nodiscard]] uint32_t chunk_tokens() const noexcept { return chunk_tokens_; }

 private:
  std::string prefix_;
  uint32_t chunk_tokens_ = 0;
  uint64_t seed_[2] = {0, 0};
};

}  // namespace kvstream::store

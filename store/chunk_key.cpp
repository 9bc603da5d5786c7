#include "store/chunk_key.hpp"

#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

#include "kvstream/storage.hpp"

namespace kvstream::store {

Result<ChunkKeyer> ChunkKeyer::create(std::string model_id, uint64_t profile_hash, uint32_t chunk_tokens) {
  KVS_RETURN_IF_ERROR(storage::validate_id(model_id, 64, "model id"));
  if (chunk_tokens == 0) return make_status(StatusCode::invalid_argument, "chunk_tokens must be at least 1");
  ChunkKeyer k;
  k.prefix_ = fmt::format("{}.{:016x}.", model_id, profile_hash);
  k.chunk_tokens_ = chunk_tokens;
  // The chain starts from what every name depends on besides tokens: a chunk of 256
  // tokens is never confused with the first 256 tokens of a 512-token chunk.
  const std::string seed = fmt::format("kvstream-chunk-key-v1\n{}\n{:016x}\n{}", model_id, profile_hash, chunk_tokens);
  const XXH128_hash_t h = XXH3_128bits(seed.data(), seed.size());
  k.seed_[0] = h.low64;
  k.seed_[1] = h.high64;
  return k;
}

std::vector<std::string> ChunkKeyer::keys(std::span<const int32_t> tokens) const {
  std::vector<std::string> out;
  uint64_t chain[2] = {seed_[0], seed_[1]};
  XXH3_state_t* st = XXH3_createState();
  if (!st) return out;  // out of memory: no names, so nothing is found or stored
  for (size_t c = 0; (c + 1) * chunk_tokens_ <= tokens.size(); ++c) {
    // h_c = XXH3-128(h_{c-1} || tokens of chunk c, as little-endian int32).
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, chain, sizeof chain);
    XXH3_128bits_update(st, tokens.data() + c * chunk_tokens_, size_t(chunk_tokens_) * sizeof(int32_t));
    const XXH128_hash_t h = XXH3_128bits_digest(st);
    chain[0] = h.low64;
    chain[1] = h.high64;
    out.push_back(fmt::format("{}{:016x}{:016x}", prefix_, h.high64, h.low64));
  }
  XXH3_freeState(st);
  return out;
}

}  // namespace kvstream::store

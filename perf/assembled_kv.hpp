// KV caches of real models' shapes assembled from genuine tinyllama KV values: every
// (layer, plane, channel) of the target draws its values from one tinyllama
// (layer, plane, channel) and from runs of tokens of many eval windows, so sizes are
// those of the real model while the statistics stay real. RoPE structure is not
// preserved (channels are mixed), so assembled caches declare RoPE off.
#pragma once

#include <string>
#include <vector>

#include "examples/tinyllama/tinyllama.hpp"
#include "kvstream/codec.hpp"
#include "kvstream/kv_model.hpp"

namespace kvstream::bench {

/// "tinyllama", "llama-7b" (32 x 32 x 128, MHA), "mistral-7b" (32 x 8 x 128, GQA),
/// "llama-70b" (80 x 8 x 128, GQA).
Result<KvGeometry> named_geometry(const std::string& name);

/// Source material: the exact KV of several windows of eval text.
struct KvSources {
  std::vector<KvCache> windows;  // each [5][2][511][32] fp32
};
Result<KvSources> source_windows(const tinyllama::Model& m, const std::vector<int>& text, int count);

/// Assembles `tokens` tokens of geometry `g` (fp16) from the sources; `seed` picks the
/// mapping, so different seeds give different but equally real caches.
Result<KvCache> assemble_kv(const KvGeometry& g, uint64_t tokens, const KvSources& src, uint64_t seed);

/// What the benchmarks on assembled caches share: a codec profile built from tokens
/// assembled out of the first half of the eval text, and a context of `tokens` tokens
/// assembled out of the second half (with the same channel mapping).
struct AssembledSetup {
  KvGeometry geometry;
  codec::Profile profile;
  KvCache context;
};
/// Loads the tinyllama data from `data_dir_option` ("" = default), assembles and
/// builds. With `like` (a tinyllama profile whose measured quality the benchmark
/// borrows), the profile is built with the same levels: progressive with its base
/// step and layers when it is progressive. Errors: those of the pieces (unknown
/// geometry, missing data).
Result<AssembledSetup> assemble_setup(const std::string& geometry, uint64_t tokens, const std::string& data_dir_option,
                                      uint64_t profile_tokens = 1024, const codec::Profile* like = nullptr);

}  // namespace kvstream::bench

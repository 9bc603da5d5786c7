// The codec quality protocol on tinyllama, shared by kvstream-profile and
// kvstream-bench: windows of BOS + 383 context tokens (whose KV goes through a codec
// as three 128-token chunks) + 128 scored tokens; the profile learns from the first
// half of the eval text and every figure is measured on the second half.
#pragma once

#include <string>
#include <vector>

#include "examples/tinyllama/tinyllama.hpp"

namespace tinyllama {

struct EvalSetup {
  int window = 512;
  int context = 384;
  int chunk_tokens = 128;
};

struct EvalData {
  Model model;
  Tokenizer tok;
  std::vector<int> first_half, second_half;  // eval text tokens, split in the middle
};

/// Loads the model, tokenizer and eval text from `dir`, splitting the tokens in half.
Result<EvalData> load_eval_data(const std::string& dir);

/// Non-overlapping windows (BOS + window-1 tokens) of `text`, at most `max` (0: all).
std::vector<std::vector<int>> make_windows(const std::vector<int>& text, const EvalSetup& s, int max = 0);

/// Per-window exact scores, computed once and compared against every codec.
struct Reference {
  std::vector<WindowScore> windows;  // with log-probabilities
  std::vector<kvstream::KvCache> context_kv;  // exact KV of each window's context
  double mean_nll = 0;
};
Result<Reference> score_reference(const Model& m, const std::vector<std::vector<int>>& windows, const EvalSetup& s,
                                  unsigned threads);

/// Quality of a KV transform against the reference.
struct Quality {
  double ppl_exact = 0, ppl = 0;
  double ppl_increase_pct = 0, ppl_increase_se = 0;  // percentage points
  double kl_nats_per_token = 0;
  double top1_agreement = 0;
};
Result<Quality> evaluate(const Model& m, const std::vector<std::vector<int>>& windows, const Reference& ref,
                         const EvalSetup& s, const KvTransform& transform, unsigned threads);

/// Encodes a chunk view and decodes it into another (a codec's round trip); the chunk
/// is part of a context of `context_tokens` tokens that starts at position 0.
using ChunkRoundTrip =
    std::function<Status(const kvstream::KvView& src, const kvstream::KvView& dst, uint64_t context_tokens)>;
/// The protocol's transform: the context's KV goes through `round_trip` in chunks of
/// `chunk_tokens` and lands in fp16 memory (as a GPU host holds KV), which the model
/// then reads.
KvTransform chunked_fp16_transform(int chunk_tokens, ChunkRoundTrip round_trip);

/// A per-(layer, plane, channel) sensitivity proxy from the weights: for K the energy
/// that the query heads of each KV head put on a channel (averaged over its RoPE
/// pair), for V the squared norm of the output-projection column it feeds.
std::vector<float> weight_sensitivity(const Model& m);

}  // namespace tinyllama

// tinyllama: a small llama2.c-format inference runtime (RMSNorm, RoPE, grouped-query
// attention, SwiGLU) that produces and consumes genuine KV caches in kvstream's KV
// model. It is the reference runtime that every codec and TTFT figure is measured on.
//
// Data: Karpathy's stories260K checkpoint and tokenizer. The directory comes from an
// option or KVSTREAM_TINYLLAMA (default ../shared/data/tinyllama); see data_dir().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvstream/kv_model.hpp"
#include "kvstream/status.hpp"

namespace tinyllama {

using kvstream::Result;
using kvstream::Status;

inline constexpr int kBos = 1;
inline constexpr int kEos = 2;

/// The data directory: `explicit_dir` if not empty, else $KVSTREAM_TINYLLAMA, else
/// ../shared/data/tinyllama.
std::string data_dir(std::string_view explicit_dir = {});

/// SentencePiece-BPE tokenizer in llama2.c's tokenizer.bin format.
class Tokenizer {
 public:
  static Result<Tokenizer> load(const std::string& path);

  /// Encodes text with the dummy prefix, optionally framed by BOS/EOS. Characters
  /// missing from the vocabulary become byte tokens, so any input encodes.
  [[nodiscard]] std::vector<int> encode(std::string_view text, bool bos, bool eos) const;
  /// The text of `token` when it follows `prev` (drops the space after BOS; byte
  /// tokens give raw bytes). Unknown ids are an error.
  [[nodiscard]] Result<std::string> decode(int prev, int token) const;
  /// Decodes a token sequence (the first token's predecessor is taken as BOS).
  [[nodiscard]] Result<std::string> decode_all(std::span<const int> tokens) const;
  [[nodiscard]] int vocab_size() const noexcept { return int(pieces_.size()); }

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> ids_;
  void encode_segment(std::string_view text, std::vector<int>& out) const;
};

struct Config {
  int dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, seq_len = 0;
  [[nodiscard]] int head_size() const noexcept { return dim / n_heads; }
  [[nodiscard]] int kv_dim() const noexcept { return n_kv_heads * head_size(); }
};

class Model;

/// Working state of one sequence: its KV cache (fp32, K after RoPE) and scratch.
/// One State per thread; a Model is shared read-only.
class State {
 public:
  explicit State(const Model& m);
  /// Tokens currently in the cache (the next token goes to this position).
  [[nodiscard]] int length() const noexcept { return length_; }
  /// Drops cached positions >= n.
  Status truncate(int n);
  /// Replaces the cache with `kv` (any dtype/layout of this model's geometry; it must
  /// start at position 0 and fit in seq_len).
  Status load_kv(const kvstream::KvView& kv);
  /// Copies positions [0, n) of the cache out as an fp32 KvCache.
  [[nodiscard]] Result<kvstream::KvCache> export_kv(int n) const;

 private:
  friend class Model;
  const Model* model_;
  int length_ = 0;
  std::vector<float> key_, value_;  // [layer][pos][kv_dim]
  std::vector<float> x_, xn_, q_, k_, v_, att_out_, hb_, hb2_, scores_, tmp_;
};

/// The stories260K-style Llama-2 model.
class Model {
 public:
  static Result<Model> load(const std::string& checkpoint_path);

  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  /// KV geometry in kvstream's model (GQA, `n_layers` x `n_kv_heads` x head size).
  [[nodiscard]] kvstream::KvGeometry geometry() const noexcept;
  /// RoPE as this model applies it to K (interleaved pairs, base 10000).
  [[nodiscard]] kvstream::RopeParams rope() const noexcept;

  /// Runs `tokens` at positions state.length().. and appends their K and V. When
  /// `logits` is not empty it receives tokens.size() x vocab logits (or only the last
  /// row when it is exactly vocab long).
  Status forward(State& st, std::span<const int> tokens, std::span<float> logits) const;

  /// The exact KV cache of `tokens` (positions 0..n-1), fp32, K after RoPE.
  [[nodiscard]] Result<kvstream::KvCache> calculate_kv(std::span<const int> tokens) const;

  /// Greedy continuation of `tokens` for `n` new tokens, given `kv`, a cache of the
  /// first kv.tokens() positions of `tokens` (possibly lossy). Prompt positions not
  /// covered by the cache are computed; when the cache covers the whole prompt, the
  /// last prompt position is recomputed against it (its logits are needed). Stops
  /// early when the model emits BOS, as llama2.c does.
  [[nodiscard]] Result<std::vector<int>> generate_with_kv(const kvstream::KvView& kv, std::span<const int> tokens,
                                                          int n) const;
  /// A weights-only sensitivity estimate per (layer, plane, channel), laid out as
  /// [layer][K|V][channel]: for K, the energy the query heads sharing a KV head put on
  /// the channel (assuming unit-RMS normalised inputs), averaged over its RoPE pair;
  /// for V, the squared norm of the output-projection column the channel feeds.
  [[nodiscard]] std::vector<float> kv_sensitivity() const;

  /// Greedy continuation without a cache.
  [[nodiscard]] Result<std::vector<int>> generate(std::span<const int> tokens, int n) const;

 private:
  friend class State;
  Config cfg_;
  std::vector<float> w_;  // transposed weight matrices, see model.cpp
  struct Layer {
    const float *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3;
  };
  std::vector<Layer> layers_;
  const float* emb_ = nullptr;    // [vocab][dim]
  const float* emb_t_ = nullptr;  // [dim][vocab]
  const float* rms_final_ = nullptr;
  std::vector<float> rope_cos_, rope_sin_;  // [seq_len][head_size/2]
  void layer_forward(State& st, int layer, int n, int pos0) const;
};

/// A hook that rewrites a context's KV cache in place (a codec round trip).
using KvTransform = std::function<Status(kvstream::KvCache&)>;

struct PerplexityOptions {
  int window = 512;         ///< tokens per window, BOS included
  int context_tokens = 0;   ///< leading window positions (BOS included) whose KV goes through `transform`
  KvTransform transform;    ///< applied to the context's exact KV; empty = identity
  unsigned threads = 0;     ///< 0: all hardware threads
  int max_windows = 0;      ///< 0: every window
  bool keep_logprobs = false;  ///< keep scored positions' log-probabilities (for KL / top-1)
};

/// One window's scores.
struct WindowScore {
  double nll_sum = 0;            ///< sum of -log p(token) over the scored tokens
  int scored = 0;
  std::vector<int> targets;      ///< the scored tokens
  std::vector<float> logprobs;   ///< scored x vocab log-probabilities (keep_logprobs only)
};

struct PerplexityResult {
  double ppl = 0;
  double mean_nll = 0;
  uint64_t scored_tokens = 0;
  std::vector<WindowScore> windows;
};

/// Scores one window `tokens` (BOS first). With context c > 1, the KV of positions
/// [0, c) is computed exactly, passed through `transform`, position c-1 is recomputed
/// against the transformed cache, and tokens [c, n) are scored; otherwise every token
/// after BOS is scored from an exact cache.
Result<WindowScore> score_window(const Model& m, std::span<const int> tokens, int context_tokens,
                                 const KvTransform& transform, bool keep_logprobs);

/// As score_window with a context, given the context's exact KV cache (of
/// tokens[0, context_kv.tokens())); a copy of it goes through `transform`.
Result<WindowScore> score_window_with_kv(const Model& m, std::span<const int> tokens, const kvstream::KvCache& context_kv,
                                         const KvTransform& transform, bool keep_logprobs);

/// Perplexity of a token stream cut into non-overlapping windows of BOS +
/// (window - 1) tokens (the last window may be shorter).
Result<PerplexityResult> perplexity(const Model& m, std::span<const int> text_tokens, const PerplexityOptions& opt);

/// Reads eval.txt-style text: collapses "\n\n" to "\n" as the training format has it.
Result<std::string> read_eval_text(const std::string& path);

}  // namespace tinyllama

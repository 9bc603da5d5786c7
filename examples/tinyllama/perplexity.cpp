// Windowed perplexity with a KV transform: the hook by which codecs are judged.
#include <algorithm>
#include <cmath>

#include "core/parallel_for.hpp"
#include "examples/tinyllama/tinyllama.hpp"

namespace tinyllama {

using kvstream::make_status;
using kvstream::StatusCode;

namespace {
// log-softmax of `logits` into `out`; returns nothing, `out` may alias `logits`.
void log_softmax(const float* logits, float* out, int n) {
  float mx = logits[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(logits[i] - mx));
  const float lse = mx + float(std::log(sum));
  for (int i = 0; i < n; ++i) out[i] = logits[i] - lse;
}
}  // namespace

namespace {
// Scores tokens[first+1, n) from positions first..n-2, with `st` holding positions
// [0, first) already.
Result<WindowScore> score_from(const Model& m, State& st, std::span<const int> tokens, int first, bool keep_logprobs) {
  const int n = int(tokens.size());
  const int vocab = m.config().vocab_size;
  const int rows = n - 1 - first;  // positions first..n-2 predict tokens first+1..n-1
  std::vector<float> logits(size_t(rows) * vocab);
  KVS_RETURN_IF_ERROR(m.forward(st, tokens.subspan(size_t(first), size_t(rows)), logits));
  WindowScore ws;
  ws.scored = rows;
  ws.targets.assign(tokens.begin() + first + 1, tokens.end());
  for (int r = 0; r < rows; ++r) {
    float* row = &logits[size_t(r) * vocab];
    log_softmax(row, row, vocab);
    ws.nll_sum -= double(row[ws.targets[r]]);
  }
  if (keep_logprobs) ws.logprobs = std::move(logits);
  return ws;
}
}  // namespace

Result<WindowScore> score_window_with_kv(const Model& m, std::span<const int> tokens, const kvstream::KvCache& context_kv,
                                         const KvTransform& transform, bool keep_logprobs) {
  const int n = int(tokens.size());
  const int context_tokens = int(context_kv.tokens());
  if (context_tokens < 2 || context_tokens >= n)
    return make_status(StatusCode::invalid_argument, "context of {} tokens for a {}-token window", context_tokens, n);
  kvstream::KvCache kv = context_kv;
  if (transform) KVS_RETURN_IF_ERROR(transform(kv).with_context("KV transform"));
  if (kv.tokens() != uint64_t(context_tokens))
    return make_status(StatusCode::internal, "KV transform changed the cache from {} to {} tokens", context_tokens,
                       kv.tokens());
  State st(m);
  KVS_RETURN_IF_ERROR(st.load_kv(kv.view()));
  // The last context position is recomputed against the transformed cache.
  const int first = context_tokens - 1;
  KVS_RETURN_IF_ERROR(st.truncate(first));
  return score_from(m, st, tokens, first, keep_logprobs);
}

Result<WindowScore> score_window(const Model& m, std::span<const int> tokens, int context_tokens,
                                 const KvTransform& transform, bool keep_logprobs) {
  const int n = int(tokens.size());
  if (n < 2) return make_status(StatusCode::invalid_argument, "a window needs at least 2 tokens, got {}", n);
  if (context_tokens >= n)
    return make_status(StatusCode::invalid_argument, "context of {} tokens leaves nothing to score in {}",
                       context_tokens, n);
  if (context_tokens > 1) {
    KVS_ASSIGN_OR_RETURN(kvstream::KvCache kv, m.calculate_kv(tokens.first(size_t(context_tokens))));
    return score_window_with_kv(m, tokens, kv, transform, keep_logprobs);
  }
  State st(m);
  return score_from(m, st, tokens, 0, keep_logprobs);
}

Result<PerplexityResult> perplexity(const Model& m, std::span<const int> text, const PerplexityOptions& opt) {
  if (opt.window < 2 || opt.window > m.config().seq_len)
    return make_status(StatusCode::invalid_argument, "window {} outside [2, {}]", opt.window, m.config().seq_len);
  const size_t per = size_t(opt.window - 1);
  size_t nwin = (text.size() + per - 1) / per;
  if (opt.max_windows > 0) nwin = std::min(nwin, size_t(opt.max_windows));
  if (nwin == 0) return make_status(StatusCode::invalid_argument, "no tokens to score");
  PerplexityResult res;
  res.windows.resize(nwin);
  KVS_RETURN_IF_ERROR(kvstream::parallel_for(nwin, opt.threads, [&](size_t i) -> Status {
    const size_t b = i * per, e = std::min(text.size(), b + per);
    std::vector<int> w{kBos};
    w.insert(w.end(), text.begin() + b, text.begin() + e);
    // A short last window keeps the same context length when it can, else it is scored whole.
    const int ctx = int(w.size()) > opt.context_tokens ? opt.context_tokens : 0;
    auto r = score_window(m, w, ctx, opt.transform, opt.keep_logprobs);
    if (!r.ok()) return r.status().with_context(fmt::format("window {}", i));
    res.windows[i] = std::move(r).value();
    return {};
  }));
  double nll = 0;
  for (size_t i = 0; i < nwin; ++i) {
    nll += res.windows[i].nll_sum;
    res.scored_tokens += uint64_t(res.windows[i].scored);
  }
  res.mean_nll = nll / double(res.scored_tokens);
  res.ppl = std::exp(res.mean_nll);
  return res;
}

}  // namespace tinyllama

#include "examples/tinyllama/eval_harness.hpp"

#include <algorithm>
#include <cmath>

#include "core/parallel_for.hpp"

namespace tinyllama {

using kvstream::make_status;
using kvstream::parallel_for;
using kvstream::StatusCode;

Result<EvalData> load_eval_data(const std::string& dir) {
  KVS_ASSIGN_OR_RETURN(Model m, Model::load(dir + "/stories260K.bin"));
  KVS_ASSIGN_OR_RETURN(Tokenizer t, Tokenizer::load(dir + "/tok512.bin"));
  KVS_ASSIGN_OR_RETURN(std::string text, read_eval_text(dir + "/eval.txt"));
  std::vector<int> ids = t.encode(text, false, false);
  EvalData d{std::move(m), std::move(t), {}, {}};
  const size_t half = ids.size() / 2;
  d.first_half.assign(ids.begin(), ids.begin() + half);
  d.second_half.assign(ids.begin() + half, ids.end());
  return d;
}

std::vector<std::vector<int>> make_windows(const std::vector<int>& text, const EvalSetup& s, int max) {
  std::vector<std::vector<int>> w;
  const size_t per = size_t(s.window - 1);
  for (size_t b = 0; b + per <= text.size(); b += per) {
    if (max > 0 && int(w.size()) >= max) break;
    std::vector<int> win{kBos};
    win.insert(win.end(), text.begin() + b, text.begin() + b + per);
    w.push_back(std::move(win));
  }
  return w;
}

Result<Reference> score_reference(const Model& m, const std::vector<std::vector<int>>& windows, const EvalSetup& s,
                                  unsigned threads) {
  Reference ref;
  ref.windows.resize(windows.size());
  ref.context_kv.resize(windows.size());
  KVS_RETURN_IF_ERROR(parallel_for(windows.size(), threads, [&](size_t i) -> Status {
    KVS_ASSIGN_OR_RETURN(ref.context_kv[i], m.calculate_kv(std::span<const int>(windows[i]).first(size_t(s.context))));
    KVS_ASSIGN_OR_RETURN(ref.windows[i], score_window_with_kv(m, windows[i], ref.context_kv[i], {}, true));
    return {};
  }));
  double nll = 0, n = 0;
  for (auto& w : ref.windows) nll += w.nll_sum, n += w.scored;
  ref.mean_nll = nll / n;
  return ref;
}

Result<Quality> evaluate(const Model& m, const std::vector<std::vector<int>>& windows, const Reference& ref,
                         const EvalSetup& /*s: the context length is in ref*/, const KvTransform& transform,
                         unsigned threads) {
  const int vocab = m.config().vocab_size;
  struct Per {
    double nll = 0, kl = 0, agree = 0;
    int n = 0;
  };
  std::vector<Per> per(windows.size());
  KVS_RETURN_IF_ERROR(parallel_for(windows.size(), threads, [&](size_t i) -> Status {
    KVS_ASSIGN_OR_RETURN(WindowScore w, score_window_with_kv(m, windows[i], ref.context_kv[i], transform, true));
    const WindowScore& e = ref.windows[i];
    Per& p = per[i];
    p.nll = w.nll_sum, p.n = w.scored;
    for (int r = 0; r < w.scored; ++r) {
      const float* lp = &e.logprobs[size_t(r) * vocab];
      const float* lq = &w.logprobs[size_t(r) * vocab];
      double kl = 0;
      for (int v = 0; v < vocab; ++v) kl += std::exp(double(lp[v])) * (double(lp[v]) - double(lq[v]));
      p.kl += kl;
      p.agree += (std::max_element(lp, lp + vocab) - lp) == (std::max_element(lq, lq + vocab) - lq);
    }
    return {};
  }));
  Quality q;
  double nll = 0, kl = 0, agree = 0, n = 0;
  std::vector<double> diff;
  for (size_t i = 0; i < per.size(); ++i) {
    nll += per[i].nll, kl += per[i].kl, agree += per[i].agree, n += per[i].n;
    diff.push_back((per[i].nll - ref.windows[i].nll_sum) / per[i].n);
  }
  q.ppl_exact = std::exp(ref.mean_nll);
  q.ppl = std::exp(nll / n);
  q.ppl_increase_pct = (q.ppl / q.ppl_exact - 1.0) * 100.0;
  // Standard error of the mean per-window NLL difference, carried to percent.
  double mean = 0;
  for (double d : diff) mean += d;
  mean /= double(diff.size());
  double var = 0;
  for (double d : diff) var += (d - mean) * (d - mean);
  var /= double(std::max<size_t>(1, diff.size() - 1));
  q.ppl_increase_se = std::sqrt(var / double(diff.size())) * 100.0 * (q.ppl / q.ppl_exact);
  q.kl_nats_per_token = kl / n;
  q.top1_agreement = agree / n;
  return q;
}

KvTransform chunked_fp16_transform(int chunk_tokens, ChunkRoundTrip round_trip) {
  return [chunk_tokens, round_trip = std::move(round_trip)](kvstream::KvCache& kv) -> Status {
    KVS_ASSIGN_OR_RETURN(kvstream::KvCache f16,
                         kvstream::KvCache::create(kv.geometry(), kvstream::DType::f16, kv.tokens()));
    for (uint64_t b = 0; b < kv.tokens(); b += uint64_t(chunk_tokens)) {
      const kvstream::TokenRange r{b, std::min<uint64_t>(kv.tokens(), b + uint64_t(chunk_tokens))};
      KVS_ASSIGN_OR_RETURN(kvstream::KvView src, kv.view().slice(r));
      KVS_ASSIGN_OR_RETURN(kvstream::KvView dst, f16.view().slice(r));
      KVS_RETURN_IF_ERROR(round_trip(src, dst, kv.tokens()));
    }
    return kvstream::copy_kv(f16.view(), kv.view());
  };
}

std::vector<float> weight_sensitivity(const Model& m) {
  return m.kv_sensitivity();
}

}  // namespace tinyllama

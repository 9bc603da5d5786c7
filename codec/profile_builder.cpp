// Offline profile build: per-channel statistics, predictor choice, per-level static
// entropy tables (clustered so they stay cache-resident), and measured sizes.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "codec/bitstream.hpp"
#include "codec/chunk_plan.hpp"
#include "codec/klt.hpp"
#include "codec/layered_quant.hpp"
#include "core/log.hpp"
#include "core/parallel_for.hpp"

namespace kvstream::codec {

namespace {

using Hist = std::array<uint64_t, 256>;

double hist_bits_free(const Hist& h) {
  uint64_t n = 0;
  for (uint64_t v : h) n += v;
  return FreqTable::entropy_bits(h) * double(n);
}
double hist_bits(const Hist& h) { return hist_bits_free(h); }

// The samples in the coding domain: per (layer, plane) a [token][channel] float
// matrix per sample, K with RoPE undone when the profile codes K before RoPE.
struct SampleSet {
  std::vector<uint32_t> tokens;                    // per sample
  std::vector<std::vector<std::vector<float>>> x;  // [sample][lp] -> T*C floats
};

// Bits to code a set of values quantized with `step` (order-0 entropy of the symbols).
double value_bits(const std::vector<float>& v, float step) {
  Hist h{};
  uint64_t outl = 0;
  for (float x : v) {
    const int q = quantize(x, 1.0f / step);
    if (q == INT32_MIN) ++outl; else ++h[size_t(q + 128)];
  }
  return hist_bits_free(h) + double(outl) * 64.0;
}

SampleSet load_samples(const Profile::Impl& p, std::span<const KvView> samples) {
  SampleSet s;
  const uint32_t C = p.geom.channels(), P = p.geom.planes();
  for (const KvView& v : samples) {
    const uint32_t T = uint32_t(v.tokens());
    RopeTable rope;
    if (unrotates(p, 0)) rope.build(p.rope, p.geom.head_dim, v.first_position(), T);
    s.tokens.push_back(T);
    auto& per = s.x.emplace_back(size_t(p.geom.layers) * P);
    for (uint32_t l = 0; l < p.geom.layers; ++l)
      for (uint32_t pl = 0; pl < P; ++pl) {
        auto& m = per[size_t(l) * P + pl];
        m.resize(size_t(T) * C);
        for (uint32_t t = 0; t < T; ++t) {
          float* row = &m[size_t(t) * C];
          v.load_row(l, pl, t, row);
          if (unrotates(p, pl)) rope.rotate(row, p.geom.kv_heads, p.geom.head_dim, p.rope.pairing, t, true);
        }
      }
  }
  return s;
}

// Runs the encoder's closed loop for one channel and adds its symbols to the
// histograms (plain and anchor roles). Outliers are counted apart.
void channel_symbols(const SampleSet& s, size_t lp, uint32_t C, uint32_t c, uint32_t G, Predictor pred, float mean,
                     float step, Hist& plain, Hist& anchor, uint64_t& outliers) {
  const float inv = 1.0f / step;
  const float base = pred == Predictor::none ? 0.0f : mean;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const std::vector<float>& m = s.x[i][lp];
    float anchor_recon = 0.0f;
    for (uint32_t t = 0; t < s.tokens[i]; ++t) {
      const float x = m[size_t(t) * C + c];
      const bool arow = pred == Predictor::anchor && is_anchor_row(t, G);
      const float pr = pred == Predictor::anchor && !arow ? anchor_recon : base;
      const int q = quantize(x - pr, inv);
      float recon = x;
      if (q == INT32_MIN) {
        ++outliers;
        ++plain[128];  // the symbol slot still codes a 0
      } else {
        recon = pr + float(q) * step;
        (arow ? anchor : plain)[size_t(q + 128)]++;
      }
      if (arow) anchor_recon = recon;
    }
  }
}

// A progressive profile's symbols of one channel: its base indices, and per
// refinement layer k its refinement symbols in each context ([k][context]), quantized
// exactly as the encoder does (values it sends exact count as zeros).
void layered_channel_symbols(const SampleSet& s, size_t lp, uint32_t C, uint32_t c, float pred, float inv_finest,
                             uint32_t n, Hist& base, std::vector<std::array<Hist, 2>>& refine) {
  std::vector<int32_t> q(n);
  refine.assign(n, {Hist{}, Hist{}});
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const std::vector<float>& m = s.x[i][lp];
    for (uint32_t t = 0; t < s.tokens[i]; ++t) {
      if (!layered_indices(m[size_t(t) * C + c] - pred, inv_finest, n, q.data())) std::fill(q.begin(), q.end(), 0);
      base[size_t(q[0] + 128)]++;
      for (uint32_t k = 1; k < n; ++k)
        refine[k][refinement_context(q[k - 1])][size_t(refinement_symbol(q[k - 1], q[k]) + 128)]++;
    }
  }
}

// Groups histograms onto at most k tables by Lloyd iterations under coded cost.
Result<std::pair<std::vector<FreqTable>, std::vector<uint32_t>>> cluster(const std::vector<Hist>& ctx, size_t k) {
  const size_t n = ctx.size();
  k = std::max<size_t>(1, std::min(k, n));
  // Start from contexts sorted by entropy, cut into k equal runs.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::vector<double> ent(n);
  for (size_t i = 0; i < n; ++i) ent[i] = FreqTable::entropy_bits(ctx[i]);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ent[a] < ent[b]; });
  std::vector<uint32_t> assign(n);
  for (size_t r = 0; r < n; ++r) assign[order[r]] = uint32_t(r * k / n);
  std::vector<FreqTable> tables;
  for (int iter = 0; iter < 4; ++iter) {
    std::vector<Hist> sum(k, Hist{});
    for (size_t i = 0; i < n; ++i)
      for (size_t v = 0; v < 256; ++v) sum[assign[i]][v] += ctx[i][v];
    tables.clear();
    std::vector<std::array<double, 256>> bits(k);
    for (size_t j = 0; j < k; ++j) {
      Hist h = sum[j];
      if (std::accumulate(h.begin(), h.end(), uint64_t(0)) == 0) h[128] = 1;  // an empty cluster still needs a table
      KVS_ASSIGN_OR_RETURN(FreqTable t, FreqTable::from_counts(h));
      for (int v = -128; v < 128; ++v) {
        Hist one{};
        one[size_t(v + 128)] = 1;
        bits[j][size_t(v + 128)] = t.cost_bits(one);
      }
      tables.push_back(std::move(t));
    }
    if (iter == 3) break;
    for (size_t i = 0; i < n; ++i) {
      double best = 1e300;
      for (size_t j = 0; j < k; ++j) {
        double cst = 0;
        for (size_t v = 0; v < 256; ++v)
          if (ctx[i][v]) cst += double(ctx[i][v]) * bits[j][v];
        if (cst < best) best = cst, assign[i] = uint32_t(j);
      }
    }
  }
  return std::make_pair(std::move(tables), std::move(assign));
}

// A progressive profile's levels: the base layer's tables from the channels' base
// indices, each refinement layer's from their symbols in both contexts.
Status build_layered_tables(Profile::Impl& p, const SampleSet& s, const std::vector<float>& level_steps,
                            uint32_t max_tables, unsigned threads) {
  const size_t N = p.channels_total();
  const uint32_t C = p.geom.channels(), n = uint32_t(level_steps.size());
  std::vector<Hist> base(N, Hist{});
  std::vector<std::vector<Hist>> refine(n, std::vector<Hist>(2 * N, Hist{}));  // [k][2 i + context]
  KVS_RETURN_IF_ERROR(parallel_for(N / C, threads, [&](size_t lp) -> Status {
    std::vector<std::array<Hist, 2>> r;
    const bool klt = p.transform_block[lp] != 0;
    for (size_t i = lp * C; i < (lp + 1) * C; ++i) {
      const float pred = klt || Predictor(p.predictor[i]) == Predictor::none ? 0.0f : p.mean[i];
      const float inv_finest = 1.0f / (klt ? level_steps[0] : level_steps[0] * p.step_scale[i]);
      layered_channel_symbols(s, lp, C, uint32_t(i % C), pred, inv_finest, n, base[i], r);
      for (uint32_t k = 1; k < n; ++k) refine[k][2 * i] = r[k][0], refine[k][2 * i + 1] = r[k][1];
    }
    return {};
  }));
  p.levels.assign(n, {});
  return parallel_for(n, threads, [&](size_t k) -> Status {
    Profile::Impl::Level& lv = p.levels[p.level_of_layer(uint32_t(k))];
    lv.info.step = level_steps[p.level_of_layer(uint32_t(k))];
    KVS_ASSIGN_OR_RETURN(auto clustered, cluster(k == 0 ? base : refine[k], max_tables));
    lv.tables = std::move(clustered.first);
    for (uint32_t role = 0; role < kRoles; ++role) lv.table_of[role].resize(N);
    for (size_t i = 0; i < N; ++i) {
      lv.table_of[kRoleCoarseZero][i] = uint8_t(clustered.second[k == 0 ? i : 2 * i]);
      lv.table_of[kRoleCoarseNonzero][i] = uint8_t(clustered.second[k == 0 ? i : 2 * i + 1]);
    }
    return {};
  });
}

}  // namespace

Result<Profile> ProfileBuilder::build(std::span<const KvView> samples, const RopeParams& rope,
                                      const ProfileOptions& opt) {
  if (samples.empty()) return make_status(StatusCode::invalid_argument, "profile build needs at least one sample");
  auto impl = std::make_unique<Profile::Impl>();
  Profile::Impl& p = *impl;
  p.geom = samples[0].geometry();
  KVS_RETURN_IF_ERROR(p.geom.validate());
  for (const KvView& v : samples)
    if (!(v.geometry() == p.geom)) return make_status(StatusCode::invalid_argument, "profile samples differ in geometry");
  p.rope = rope;
  p.k_before_rope = opt.code_k_before_rope && rope.enabled && p.geom.kind != AttentionKind::mla;
  if (rope.enabled) {
    const uint32_t rot = rope.rotary_dim ? rope.rotary_dim : p.geom.head_dim;
    if (rope.rotary_dim > p.geom.head_dim || rot < 2 || rot % 2 != 0 || !(rope.base > 1.0f))
      return make_status(StatusCode::invalid_argument, "RoPE over {} of {} channels with base {} is not a rotation",
                         rot, p.geom.head_dim, rope.base);
  }
  if (p.k_before_rope && (rope.rotary_dim ? rope.rotary_dim : p.geom.head_dim) > 1024)
    return make_status(StatusCode::unsupported, "coding K before RoPE supports up to 1024 rotary channels per head");
  if (opt.group_size == 0 || opt.group_size > 65535)
    return make_status(StatusCode::invalid_argument, "group size {} (1..65535)", opt.group_size);
  p.group_size = opt.group_size;
  p.progressive = opt.progressive;
  std::vector<float> level_steps = opt.level_steps;
  if (opt.progressive) {
    if (opt.progressive_layers == 0 || opt.progressive_layers > kMaxProgressiveLayers)
      return make_status(StatusCode::invalid_argument, "{} progressive layers (1..{})", opt.progressive_layers,
                         kMaxProgressiveLayers);
    if (!(opt.progressive_base_step > 0.0f) || !std::isfinite(opt.progressive_base_step))
      return make_status(StatusCode::invalid_argument, "progressive base step {} must be > 0", opt.progressive_base_step);
    if (opt.recent_tokens) {
      if (opt.recent_tokens > kMaxChunkTokens || opt.recent_layers == 0 || opt.recent_layers >= opt.progressive_layers)
        return make_status(StatusCode::invalid_argument,
                           "recent window of {} tokens with {} layers (1..{} tokens, 1..{} layers)", opt.recent_tokens,
                           opt.recent_layers, kMaxChunkTokens, opt.progressive_layers - 1);
      p.recent_tokens = opt.recent_tokens, p.recent_layers = opt.recent_layers;
      p.recent_lead = opt.recent_lead;
    }
    // Level i (0 finest) is layer n - 1 - i: the base step divided by 3 per layer.
    level_steps.assign(opt.progressive_layers, 0.0f);
    for (uint32_t i = 0; i < opt.progressive_layers; ++i)
      level_steps[i] = float(double(opt.progressive_base_step) / std::pow(double(kRefineRatio), opt.progressive_layers - 1 - i));
  }
  if (level_steps.empty() || level_steps.size() > kMaxLevels)
    return make_status(StatusCode::invalid_argument, "{} levels (1..{})", level_steps.size(), kMaxLevels);
  if (opt.max_tables_per_level == 0 || opt.max_tables_per_level > RANS_MAX_TABLES)
    return make_status(StatusCode::invalid_argument, "max_tables_per_level {}", opt.max_tables_per_level);
  const size_t N = p.channels_total();
  const uint32_t C = p.geom.channels(), G = p.group_size;
  if (!opt.channel_weights.empty() && opt.channel_weights.size() != N)
    return make_status(StatusCode::invalid_argument, "{} channel weights for {} channels", opt.channel_weights.size(), N);

  SampleSet s = load_samples(p, samples);
  // Mean and variance per channel.
  p.mean.assign(N, 0.0f);
  std::vector<double> var(N, 0.0);
  for (size_t lp = 0; lp < N / C; ++lp)
    for (uint32_t c = 0; c < C; ++c) {
      double sum = 0, sq = 0;
      uint64_t n = 0;
      for (size_t i = 0; i < s.tokens.size(); ++i)
        for (uint32_t t = 0; t < s.tokens[i]; ++t) {
          const double x = s.x[i][lp][size_t(t) * C + c];
          sum += x, sq += x * x, ++n;
        }
      const double mu = sum / double(n);
      p.mean[lp * C + c] = float(mu);
      var[lp * C + c] = std::max(sq / double(n) - mu * mu, 1e-12);
    }
  // Step scale: 1/sqrt(weight), normalised so that the geometric mean of step/sigma
  // is 1 (level steps are then in units of a typical channel's deviation).
  p.step_scale.resize(N);
  double log_ratio = 0;
  for (size_t i = 0; i < N; ++i) {
    const double w = opt.channel_weights.empty() ? 1.0 / var[i] : std::max<double>(opt.channel_weights[i], 1e-30);
    p.step_scale[i] = float(1.0 / std::sqrt(w));
    log_ratio += std::log(p.step_scale[i] / std::sqrt(var[i]));
  }
  const double norm = std::exp(-log_ratio / double(N));
  for (float& m : p.step_scale) m = float(m * norm);
  if (!opt.layer_plane_step.empty()) {
    if (opt.layer_plane_step.size() != N / C)
      return make_status(StatusCode::invalid_argument, "{} layer/plane step multipliers for {} layer-planes",
                         opt.layer_plane_step.size(), N / C);
    for (size_t i = 0; i < N; ++i) {
      const float f = opt.layer_plane_step[i / C];
      if (!(f > 0.0f) || !std::isfinite(f))
        return make_status(StatusCode::invalid_argument, "layer/plane step multiplier {} must be > 0", f);
      p.step_scale[i] *= f;
    }
  }

  // Predictor per channel: the cheapest residuals at the middle level.
  // (A progressive profile decides at its base step: every prefix holds the base, and
  // the base is what a chooser bound by quality fetches most.)
  const float mid_step = opt.progressive ? level_steps.back() : level_steps[level_steps.size() / 2];
  p.predictor.assign(N, uint8_t(Predictor::mean));
  std::vector<double> channel_bits(N, 0.0);
  KVS_RETURN_IF_ERROR(parallel_for(N / C, opt.threads, [&](size_t lp) -> Status {
    for (uint32_t c = 0; c < C; ++c) {
      const size_t i = lp * C + c;
      double best = 1e300;
      for (Predictor pr : {Predictor::mean, Predictor::none, Predictor::anchor}) {
        // A progressive stream's layers nest only with a prediction that no layer changes.
        if ((pr == Predictor::anchor && (!opt.allow_anchor || opt.progressive)) ||
            (pr == Predictor::mean && !opt.allow_mean))
          continue;
        Hist a{}, b{};
        uint64_t outl = 0;
        channel_symbols(s, lp, C, c, G, pr, p.mean[i], mid_step * p.step_scale[i], a, b, outl);
        const double bits = hist_bits(a) + hist_bits(b) + double(outl) * 64.0;
        if (bits < best * 0.995) best = bits, p.predictor[i] = uint8_t(pr);  // a simpler predictor wins ties
      }
      channel_bits[i] = best;
    }
    return {};
  }));

  // Decorrelating transform per (layer, plane), where it measurably pays.
  const size_t LP = N / C;
  p.transform_block.assign(LP, 0);
  p.transform.assign(LP, {});
  std::vector<uint32_t> candidates;
  if (opt.allow_transform) {
    // Whole heads first, then groups of 2, 4, ... heads, up to the block limit.
    for (uint32_t B = p.geom.head_dim; B <= C && B <= opt.max_transform_block; B *= 2)
      if (C % B == 0 && B > 1) candidates.push_back(B);
  }
  uint64_t total_tokens = 0;
  for (uint32_t t : s.tokens) total_tokens += t;
  // Each (layer, plane) in parallel: it reads its own samples and writes only its own
  // transform, predictors and samples.
  KVS_RETURN_IF_ERROR(parallel_for(candidates.empty() ? 0 : LP, opt.threads, [&](size_t lp) -> Status {
    double identity = 0;
    for (uint32_t c = 0; c < C; ++c) identity += channel_bits[lp * C + c];
    // The normalised residuals z = (x - mean) / scale of every sample token.
    std::vector<float> z(total_tokens * C);
    size_t row = 0;
    for (size_t i = 0; i < s.tokens.size(); ++i)
      for (uint32_t t = 0; t < s.tokens[i]; ++t, ++row)
        for (uint32_t c = 0; c < C; ++c)
          z[row * C + c] = (s.x[i][lp][size_t(t) * C + c] - p.mean[lp * C + c]) / p.step_scale[lp * C + c];
    double best_bits = identity * (1.0 - opt.transform_min_gain);
    uint32_t best_b = 0;
    std::vector<float> best_u, best_y;
    for (uint32_t B : candidates) {
      std::vector<float> u(size_t(C) * B), y(z.size());
      for (uint32_t b0 = 0; b0 < C; b0 += B) {
        std::vector<double> cov(size_t(B) * B, 0.0);
        for (size_t r = 0; r < total_tokens; ++r) {
          const float* zr = &z[r * C + b0];
          for (uint32_t a = 0; a < B; ++a)
            for (uint32_t b = 0; b < B; ++b) cov[size_t(a) * B + b] += double(zr[a]) * zr[b];
        }
        const std::vector<float> ub = klt_basis(cov, B);
        std::copy(ub.begin(), ub.end(), u.begin() + size_t(b0) * B);
        for (size_t r = 0; r < total_tokens; ++r) klt_forward(ub.data(), B, &z[r * C + b0], &y[r * C + b0]);
      }
      double bits = 0;
      std::vector<float> comp(total_tokens);
      for (uint32_t j = 0; j < C; ++j) {
        for (size_t r = 0; r < total_tokens; ++r) comp[r] = y[r * C + j];
        bits += value_bits(comp, mid_step);
      }
      if (bits < best_bits) best_bits = bits, best_b = B, best_u = std::move(u), best_y = std::move(y);
    }
    if (!best_b) return {};
    KVS_LOG_DEBUG("layer {} plane {}: KLT blocks of {} save {:.1f}% of the bits", lp / p.geom.planes(),
                  lp % p.geom.planes(), best_b, 100.0 * (1.0 - best_bits / identity));
    p.transform_block[lp] = best_b;
    p.transform[lp] = std::move(best_u);
    for (uint32_t c = 0; c < C; ++c) p.predictor[lp * C + c] = uint8_t(Predictor::mean);
    // From here on this (layer, plane)'s samples are its components.
    row = 0;
    for (size_t i = 0; i < s.tokens.size(); ++i)
      for (uint32_t t = 0; t < s.tokens[i]; ++t, ++row)
        std::copy_n(&best_y[row * C], C, &s.x[i][lp][size_t(t) * C]);
    return {};
  }));

  for (float step : level_steps)
    if (!(step > 0.0f)) return make_status(StatusCode::invalid_argument, "level step {} must be > 0", step);
  if (opt.progressive) {
    KVS_RETURN_IF_ERROR(build_layered_tables(p, s, level_steps, opt.max_tables_per_level, opt.threads));
  }
  // Per level, in parallel: histograms per (channel, role), clustered onto shared tables.
  if (!opt.progressive) p.levels.assign(level_steps.size(), {});
  KVS_RETURN_IF_ERROR(parallel_for(opt.progressive ? 0 : level_steps.size(), opt.threads, [&](size_t L) -> Status {
    const float step = level_steps[L];
    Profile::Impl::Level& lv = p.levels[L];
    lv.info.step = step;
    std::vector<Hist> ctx;
    std::vector<size_t> ctx_plain(N), ctx_anchor(N);
    for (size_t i = 0; i < N; ++i) {
      Hist a{}, b{};
      uint64_t outl = 0;
      const auto pr = Predictor(p.predictor[i]);
      if (p.transform_block[i / C])  // components: no predictor, the level step as it is
        channel_symbols(s, i / C, C, uint32_t(i % C), G, Predictor::none, 0.0f, step, a, b, outl);
      else
        channel_symbols(s, i / C, C, uint32_t(i % C), G, pr, p.mean[i], step * p.step_scale[i], a, b, outl);
      ctx_plain[i] = ctx.size();
      ctx.push_back(a);
      if (pr == Predictor::anchor) {
        ctx_anchor[i] = ctx.size();
        ctx.push_back(b);
      } else {
        ctx_anchor[i] = ctx_plain[i];  // anchor rows of other channels look like their plain rows
      }
    }
    KVS_ASSIGN_OR_RETURN(auto clustered, cluster(ctx, opt.max_tables_per_level));
    lv.tables = std::move(clustered.first);
    for (uint32_t r = 0; r < kRoles; ++r) lv.table_of[r].resize(N);
    for (size_t i = 0; i < N; ++i) {
      lv.table_of[kRolePlain][i] = uint8_t(clustered.second[ctx_plain[i]]);
      lv.table_of[kRoleAnchor][i] = uint8_t(clustered.second[ctx_anchor[i]]);
    }
    return {};
  }));
  KVS_RETURN_IF_ERROR(p.finalize());
  Profile profile(std::move(impl));

  // Measured size per level: encode every sample, count every byte.
  uint64_t elems = 0;
  for (const KvView& v : samples) elems += v.tokens() * p.geom.elements_per_token();
  if (p.progressive) {
    // One encode per sample holds every level: level i is its whole-layer prefix.
    // The samples encode in parallel; their prefixes are summed in sample order.
    std::vector<uint64_t> bytes(profile.levels(), 0);
    std::vector<double> distortion(profile.levels(), 0.0);  // weighted by each sample's elements
    std::vector<std::vector<ChunkPrefix>> prefixes(samples.size());
    KVS_RETURN_IF_ERROR(parallel_for(samples.size(), opt.threads, [&](size_t i) -> Status {
      std::vector<uint8_t> out;
      KVS_RETURN_IF_ERROR(encode_chunk(profile, samples[i], 0, out));
      KVS_ASSIGN_OR_RETURN(prefixes[i], chunk_prefixes(out));
      return {};
    }));
    for (size_t i = 0; i < samples.size(); ++i)
      for (const ChunkPrefix& pf : prefixes[i])
        if (pf.whole_layer) {
          bytes[pf.level] += pf.end;
          distortion[pf.level] += pf.distortion * double(samples[i].tokens() * p.geom.elements_per_token());
        }
    for (uint32_t L = 0; L < profile.levels(); ++L) {
      profile.impl_->levels[L].info.bits_per_element = double(bytes[L]) * 8.0 / double(elems);
      profile.impl_->levels[L].info.distortion = distortion[L] / double(elems);
    }
  }
  // Levels in parallel; the profile is written only once every encode is done.
  std::vector<uint64_t> level_bytes(p.progressive ? 0 : profile.levels(), 0);
  KVS_RETURN_IF_ERROR(parallel_for(level_bytes.size(), opt.threads, [&](size_t L) -> Status {
    std::vector<uint8_t> out;
    for (const KvView& v : samples) {
      out.clear();
      KVS_RETURN_IF_ERROR(encode_chunk(profile, v, uint32_t(L), out));
      level_bytes[L] += out.size();
    }
    return {};
  }));
  for (size_t L = 0; L < level_bytes.size(); ++L)
    profile.impl_->levels[L].info.bits_per_element = double(level_bytes[L]) * 8.0 / double(elems);
  KVS_RETURN_IF_ERROR(profile.impl_->finalize());
  const auto counts = profile.predictor_counts();
  KVS_LOG_INFO("codec profile built: {} channels (none {}, mean {}, anchor {}), {} levels, {:.2f}..{:.2f} bits/element",
               N, counts[0], counts[1], counts[2], profile.levels(), profile.level(0).bits_per_element,
               profile.level(profile.levels() - 1).bits_per_element);
  return profile;
}

}  // namespace kvstream::codec

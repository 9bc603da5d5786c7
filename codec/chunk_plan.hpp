// Per-(level, layer, plane) quantization plan and the RoPE table of a chunk: the
// numbers the encoder and every decoder must compute identically.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "codec/klt.hpp"
#include "codec/profile_impl.hpp"
#include "codec/reconstruct_kernels.hpp"

namespace kvstream::codec {

/// One (layer, plane) matrix's per-channel constants at one level.
struct MatrixPlan {
  std::vector<float> step;    // quantization step per channel
  std::vector<float> inv;     // 1 / step
  std::vector<float> base;    // prediction for plain and anchor rows: the mean, or 0
  std::vector<uint8_t> anchor;  // 1 for channels coded against their group's anchor
  bool has_anchor = false;
  // KLT path: components are quantized with the level step and reconstructed as
  // x = mean + scale * (U y).
  uint32_t block = 0;
  const float* u = nullptr;    // U, blocks of block x block, row-major (encoder)
  const float* ut = nullptr;   // U^T per block (decoder)
  const float* mean = nullptr;
  const float* scale = nullptr;
  const uint8_t* table_plain = nullptr;
  const uint8_t* table_anchor = nullptr;

  void build(const Profile::Impl& p, uint32_t level, uint32_t l, uint32_t pl) {
    const uint32_t C = p.geom.channels();
    step.resize(C), inv.resize(C), base.resize(C), anchor.resize(C);
    const float s0 = p.levels[level].info.step;
    const size_t b = p.idx(l, pl, 0);
    has_anchor = false;
    const size_t lp = size_t(l) * p.geom.planes() + pl;
    block = p.block_of(lp);
    if (block) {
      u = p.transform[lp].data();
      ut = p.transform_t[lp].data();
      mean = &p.mean[b];
      scale = &p.step_scale[b];
      for (uint32_t c = 0; c < C; ++c) step[c] = s0, inv[c] = 1.0f / s0, base[c] = 0.0f, anchor[c] = 0;
      table_plain = p.levels[level].table_of[kRolePlain].data() + b;
      table_anchor = p.levels[level].table_of[kRoleAnchor].data() + b;
      return;
    }
    for (uint32_t c = 0; c < C; ++c) {
      step[c] = s0 * p.step_scale[b + c];
      inv[c] = 1.0f / step[c];
      const auto pred = Predictor(p.predictor[b + c]);
      base[c] = pred == Predictor::none ? 0.0f : p.mean[b + c];
      anchor[c] = pred == Predictor::anchor;
      has_anchor |= anchor[c] != 0;
    }
    table_plain = p.levels[level].table_of[kRolePlain].data() + b;
    table_anchor = p.levels[level].table_of[kRoleAnchor].data() + b;
  }
};

/// cos/sin of every (token, rotary pair) of a chunk, with the formula rope_rotate uses.
struct RopeTable {
  std::vector<float> cos, sin;
  // Per (token, rotary channel): the channel's cosine, its signed sine and partner,
  // so that the forward rotation is out[d] = x[d] * ec[d] + x[partner[d]] * es[d]
  // (the same products and sums as the pairwise formula, hence the same bits).
  std::vector<float> ec, es;
  std::vector<uint32_t> partner;
  // Whole power-of-two heads rotate through rope_forward_rows: ec/es per token
  // repeated to `width` (at least one 16-float vector), partner d ^ xor_mask.
  std::vector<float> ecw, esw;
  uint32_t width = 0, xor_mask = 0;
  uint32_t pairs = 0, rot = 0;
  RopePairing pairing = RopePairing::interleaved;
  // What the table holds: positions [first, first + tokens) of `params`, `head_dim`.
  RopeParams params{};
  uint32_t head_dim = 0;
  uint64_t first = 0, tokens = 0;

  /// True when positions [first_position, first_position + n) are in the table.
  [[nodiscard]] bool covers(const RopeParams& r, uint32_t hd, uint64_t first_position, uint64_t n) const {
    // Written so that no sum can wrap: positions come from untrusted chunk headers.
    return r == params && hd == head_dim && first_position >= first && n <= tokens &&
           first_position - first <= tokens - n;
  }
  /// Makes the table cover [first_position, first_position + n) and returns the row
  /// of first_position. A decoder keeps one table across chunks (building costs a
  /// sin and cos per pair and token, a sizeable share of decoding a short chunk), so
  /// the table grows to a span of recent positions of up to 2^18 (token, channel)
  /// entries (a few MiB) or one chunk, whichever is more.
  uint64_t ensure(const RopeParams& r, uint32_t hd, uint64_t first_position, uint64_t n) {
    if (!covers(r, hd, first_position, n)) {
      const uint64_t max_span = std::max<uint64_t>(n, (uint64_t(1) << 18) / std::max<uint32_t>(hd, 1));
      uint64_t lo = first_position, hi = first_position + n;
      const bool no_wrap = first_position <= UINT64_MAX - n && first <= UINT64_MAX - tokens;
      if (no_wrap && r == params && hd == head_dim && tokens > 0 &&
          std::max(hi, first + tokens) - std::min(lo, first) <= max_span)
        lo = std::min(lo, first), hi = std::max(hi, first + tokens);
      else
        hi = lo + n;  // this chunk alone (its positions may wrap, as the encoder's do)
      build(r, hd, lo, uint32_t(hi - lo));
    }
    return first_position - first;
  }
  void build(const RopeParams& r, uint32_t hd, uint64_t first_position, uint32_t n) {
    params = r, head_dim = hd, first = first_position, tokens = n;
    rot = r.rotary_dim == 0 || r.rotary_dim > hd ? hd : r.rotary_dim;
    pairs = rot / 2;
    pairing = r.pairing;
    cos.resize(size_t(n) * pairs), sin.resize(size_t(n) * pairs);
    ec.resize(size_t(n) * rot), es.resize(size_t(n) * rot), partner.resize(rot);
    for (uint32_t i = 0; i < pairs; ++i) {
      const uint32_t a = r.pairing == RopePairing::interleaved ? 2 * i : i;
      const uint32_t b = r.pairing == RopePairing::interleaved ? 2 * i + 1 : i + pairs;
      partner[a] = b, partner[b] = a;
    }
    std::vector<float> freq(pairs);
    for (uint32_t i = 0; i < pairs; ++i) freq[i] = 1.0f / std::pow(r.base, float(2 * i) / float(rot));
    for (uint32_t t = 0; t < n; ++t)
      for (uint32_t i = 0; i < pairs; ++i) {
        const float a = float(int64_t(first_position + t)) * freq[i];
        cos[size_t(t) * pairs + i] = std::cos(a);
        sin[size_t(t) * pairs + i] = std::sin(a);
        const uint32_t ia = r.pairing == RopePairing::interleaved ? 2 * i : i;
        const uint32_t ib = r.pairing == RopePairing::interleaved ? 2 * i + 1 : i + pairs;
        ec[size_t(t) * rot + ia] = ec[size_t(t) * rot + ib] = std::cos(a);
        es[size_t(t) * rot + ia] = -std::sin(a);
        es[size_t(t) * rot + ib] = std::sin(a);
      }
    const bool pow2 = rot == hd && hd >= 2 && (hd & (hd - 1)) == 0 && hd <= 256;
    width = pow2 ? std::max<uint32_t>(hd, 16) : 0;
    xor_mask = r.pairing == RopePairing::interleaved ? 1 : hd / 2;
    // Heads of 16 or more use ec/es as they are.
    const uint32_t repeated = width > rot ? width : 0;
    ecw.resize(size_t(n) * repeated), esw.resize(size_t(n) * repeated);
    for (uint32_t t = 0; t < n && repeated; ++t)
      for (uint32_t i = 0; i < width; ++i) {
        ecw[size_t(t) * width + i] = ec[size_t(t) * rot + i % hd];
        esw[size_t(t) * width + i] = es[size_t(t) * rot + i % hd];
      }
  }
  /// Forward rotation (decoder) of `rows` rows of table rows first_t..
  void rotate_tile(float* x, uint32_t rows, uint64_t first_t, uint32_t heads, uint32_t hd) const {
    if (width && (heads * hd) % width == 0) {
      const bool repeated = width > rot;
      rope_forward_rows(x, rows, heads * hd, width, xor_mask, (repeated ? ecw : ec).data() + first_t * width,
                        (repeated ? esw : es).data() + first_t * width);
      return;
    }
    rope_forward_tile(x, rows, uint32_t(first_t), heads, hd, rot, pairing == RopePairing::interleaved, ec.data(),
                      es.data(), partner.data());
  }
  /// Rotates every head of one token's row (inverse = undo).
  void rotate(float* row, uint32_t heads, uint32_t head_dim, RopePairing pairing, uint32_t t, bool inverse) const {
    const float* cs = cos.data() + size_t(t) * pairs;  // data(): no reference into an empty table
    const float* sn = sin.data() + size_t(t) * pairs;
    const float sign = inverse ? -1.0f : 1.0f;
    for (uint32_t h = 0; h < heads; ++h) {
      float* v = row + size_t(h) * head_dim;
      for (uint32_t i = 0; i < pairs; ++i) {
        const uint32_t a = pairing == RopePairing::interleaved ? 2 * i : i;
        const uint32_t b = pairing == RopePairing::interleaved ? 2 * i + 1 : i + pairs;
        const float s = sign * sn[i];
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * cs[i] - x1 * s;
        v[b] = x0 * s + x1 * cs[i];
      }
    }
  }
};

/// A value an encoder sends exact: index t * channels + c, and the value.
struct ExactValue {
  uint32_t index;
  float value;
};

/// Token t's row of (l, pl) in the coding domain, as both encoders quantize it: K with
/// RoPE undone when `rope` is given, and on KLT planes (plan.block) the components
/// y = U^T ((x - mean) / scale). There a value far outside its channel's range (beyond
/// `limit` in step-scale units) would smear over every component: it is appended to
/// `direct` (sent exact, replacing the reconstruction) and enters the transform as
/// the mean. `row` and `z` hold C floats.
inline void coding_row(const Profile::Impl& p, const MatrixPlan& plan, const KvView& chunk, uint32_t l, uint32_t pl,
                       uint32_t t, const RopeTable* rope, float limit, float* row, float* z,
                       std::vector<ExactValue>& direct) {
  const uint32_t C = p.geom.channels();
  chunk.load_row(l, pl, t, row);
  if (rope) rope->rotate(row, p.geom.kv_heads, p.geom.head_dim, p.rope.pairing, t, true);
  if (!plan.block) return;
  for (uint32_t c = 0; c < C; ++c) {
    z[c] = (row[c] - plan.mean[c]) / plan.scale[c];
    if (!(std::fabs(z[c]) <= limit)) {
      direct.push_back({t * C + c, row[c]});
      z[c] = 0.0f;
    }
  }
  for (uint32_t b = 0; b < C; b += plan.block) klt_forward(plan.u + size_t(b) * plan.block, plan.block, &z[b], &row[b]);
}

/// Quantizes one residual; values beyond the symbol range become outliers.
inline int quantize(float r, float inv) {
  const float q = std::nearbyint(r * inv);
  if (!(q >= -127.0f && q <= 127.0f)) return INT32_MIN;  // also catches NaN
  return int(q);
}

/// Flat index of token t's row in the plain matrix and, for anchor rows, the anchor matrix.
inline bool is_anchor_row(uint32_t t, uint32_t group) { return t % group == 0; }
inline uint32_t plain_row(uint32_t t, uint32_t group, bool has_anchor) {
  return has_anchor ? t - (t / group + 1) : t;
}

}  // namespace kvstream::codec

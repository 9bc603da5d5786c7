// Synthetic KV-like data shared by the codec and GPU decoder tests: channels with
// offsets and scales, correlated through a few shared AR(1) factors, K rotated by RoPE
// at the cache's positions (never for MLA).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kvstream/kv_model.hpp"

namespace kvstream::test_util {

inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// A deterministic number in [0, 1) keyed by four integers.
inline double keyed_unit(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t s = a * 0x100000001b3ull ^ (b << 20) ^ (c << 40) ^ (d * 0x9e3779b97f4a7c15ull);
  return double(splitmix(s) >> 11) * 0x1p-53;
}

inline bool k_is_rotated(const KvGeometry& g, const RopeParams& rope, uint32_t plane) {
  return plane == 0 && rope.enabled && g.kind != AttentionKind::mla;
}

/// Fills `cache` (any dtype) with correlated KV-like data.
inline void fill_synthetic(KvCache& cache, const RopeParams& rope, uint64_t seed) {
  const KvGeometry& g = cache.geometry();
  const uint32_t C = g.channels();
  constexpr int F = 4;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::vector<float> row(C);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p) {
      std::vector<double> off(C), scale(C), w(size_t(C) * F);
      for (uint32_t c = 0; c < C; ++c) {
        off[c] = 4.0 * (keyed_unit(l, p, c, 1) - 0.5);
        scale[c] = 0.25 + 1.75 * keyed_unit(l, p, c, 2);
        for (int k = 0; k < F; ++k) w[size_t(c) * F + k] = 2.0 * keyed_unit(l, p, c, 10 + k) - 1.0;
      }
      double z[F];
      for (double& v : z) v = n01(rng);
      for (uint64_t t = 0; t < cache.tokens(); ++t) {
        for (double& v : z) v = 0.9 * v + 0.4359 * n01(rng);
        for (uint32_t c = 0; c < C; ++c) {
          double s = 0;
          for (int k = 0; k < F; ++k) s += w[size_t(c) * F + k] * z[k];
          row[c] = float(off[c] + scale[c] * (0.8 * s + 0.3 * n01(rng)));
        }
        if (k_is_rotated(g, rope, p))
          for (uint32_t h = 0; h < g.kv_heads; ++h)
            rope_rotate(&row[size_t(h) * g.head_dim], g.head_dim, int64_t(cache.first_position() + t), rope, false);
        for (uint32_t c = 0; c < C; ++c) cache.set(l, p, t, c, row[c]);
      }
    }
}

/// A cache of `tokens` synthetic tokens from position `first`, K rotated by `rope`.
inline KvCache synthetic_cache(const KvGeometry& g, DType dt, uint64_t tokens, uint64_t first, const RopeParams& rope,
                               uint64_t seed) {
  KvCache c = KvCache::create(g, dt, tokens, first).value();
  c.set_rope(rope);
  fill_synthetic(c, rope, seed);
  return c;
}

}  // namespace kvstream::test_util

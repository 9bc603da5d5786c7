// The codec test cases shared by test_codec.cpp, test_codec_corrupt.cpp and
// test_codec_profile.cpp: five geometries (MHA, GQA with RoPE of both pairings, full
// and partial, coded before or after RoPE, MLA), the profile each builds from
// synthetic samples, and the small helpers those tests all use. Building a profile is
// the slow part, so each is built once per binary and shared by every file's tests
// (the cache is a static of an inline function: one per program, not one per file).
//
// The data is synthetic_kv.hpp's: per (layer, plane) a few AR(1) latent factors shared
// by all channels (so channels are correlated and tokens are correlated), per-channel
// offsets and scales, and K rotated with kvstream::rope_rotate at the token's
// position, so it looks like a real post-RoPE K.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kvstream/codec.hpp"
#include "kvstream/kv_model.hpp"
#include "kvstream/log.hpp"
#include "tests/codec/synthetic_kv.hpp"

namespace kvstream::codec::test {

// ---- Synthetic data ---------------------------------------------------------------

// A cache of test_util::fill_synthetic's data from `first_position`, K rotated by
// `rope`; a failed creation is reported with its status.
inline KvCache make_cache(const KvGeometry& g, DType dt, uint64_t tokens, uint64_t first_position,
                          const RopeParams& rope, uint64_t seed) {
  auto c = KvCache::create(g, dt, tokens, first_position);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  KvCache cache = std::move(c).value();
  cache.set_rope(rope);
  test_util::fill_synthetic(cache, rope, seed);
  return cache;
}

// ---- Profiles, shared by the tests that use the same configuration ------------------

struct Case {
  const char* name;
  KvGeometry geom;
  RopeParams rope;
  bool code_k_before_rope = true;
  uint32_t group_size = 10;
  uint32_t max_tables = 16;
};

inline const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"mha", {2, 4, 16, 4, AttentionKind::mha}, {}, true, 10, 128},
      {"gqa_rope_interleaved", {2, 2, 32, 8, AttentionKind::gqa}, {true, 10000.0f, 0, RopePairing::interleaved}},
      {"gqa_rope_half_partial", {2, 2, 32, 4, AttentionKind::gqa}, {true, 500000.0f, 16, RopePairing::half}, true, 7},
      {"gqa_rope_coded_after", {1, 2, 16, 4, AttentionKind::gqa}, {true, 10000.0f, 0, RopePairing::half}, false},
      {"mla", {2, 1, 64, 16, AttentionKind::mla}, {}},
  };
  return c;
}

struct Built {
  std::vector<KvCache> samples;  // f32, what the profile was built from
  Profile profile;
  std::vector<double> sum_var;   // per (layer, plane): sum over channels of the coding-domain variance
};

// Coding domain = what the codec quantizes: K with RoPE undone when the profile says so.
inline void coding_row(const Profile& prof, const KvCache& c, uint32_t l, uint32_t p, uint64_t t, float* row) {
  const KvGeometry& g = c.geometry();
  for (uint32_t ch = 0; ch < g.channels(); ++ch) row[ch] = c.at(l, p, t, ch);
  if (prof.codes_k_before_rope() && p == 0)
    for (uint32_t h = 0; h < g.kv_heads; ++h)
      rope_rotate(row + size_t(h) * g.head_dim, g.head_dim, int64_t(c.first_position() + t), prof.rope(), true);
}

inline const Built& built(const Case& cs) {
  static std::map<std::string, Built> cache;
  auto it = cache.find(cs.name);
  if (it != cache.end()) return it->second;
  set_log_level(LogLevel::warn);
  Built b;
  b.samples.push_back(make_cache(cs.geom, DType::f32, 96, 0, cs.rope, 11));
  b.samples.push_back(make_cache(cs.geom, DType::f32, 64, 300, cs.rope, 12));
  std::vector<KvView> views;
  for (const KvCache& s : b.samples) views.push_back(s.view());
  ProfileOptions opt;
  opt.group_size = cs.group_size;
  opt.code_k_before_rope = cs.code_k_before_rope;
  opt.max_tables_per_level = cs.max_tables;
  auto prof = ProfileBuilder::build(views, cs.rope, opt);
  EXPECT_TRUE(prof.ok()) << cs.name << ": " << prof.status().to_string();
  if (prof.ok()) b.profile = std::move(prof).value();
  // Per (layer, plane) sum of the per-channel variances the builder sees.
  const KvGeometry& g = cs.geom;
  const uint32_t C = g.channels();
  std::vector<float> row(C);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p) {
      std::vector<double> sum(C, 0.0), sq(C, 0.0);
      double n = 0;
      for (const KvCache& s : b.samples)
        for (uint64_t t = 0; t < s.tokens(); ++t) {
          coding_row(b.profile, s, l, p, t, row.data());
          for (uint32_t c = 0; c < C; ++c) sum[c] += row[c], sq[c] += double(row[c]) * row[c];
          n += 1;
        }
      double total = 0;
      for (uint32_t c = 0; c < C; ++c) total += std::max(sq[c] / n - (sum[c] / n) * (sum[c] / n), 1e-12);
      b.sum_var.push_back(total);
    }
  return cache.emplace(cs.name, std::move(b)).first->second;
}

inline const Case& case_named(const std::string& n) {
  for (const Case& c : cases())
    if (n == c.name) return c;
  std::abort();
}

// ---- Helpers -------------------------------------------------------------------------

inline std::vector<uint8_t> encode(const Profile& prof, const KvView& v, uint32_t level) {
  std::vector<uint8_t> out;
  const Status st = encode_chunk(prof, v, level, out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

inline bool same_bytes(const KvCache& a, const KvCache& b) {
  return a.bytes().size() == b.bytes().size() && std::memcmp(a.bytes().data(), b.bytes().data(), a.bytes().size()) == 0;
}

inline bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

}  // namespace kvstream::codec::test

// Tests for the public codec API (include/kvstream/codec.hpp): profiles, chunk
// encode/decode round trips over geometries, dtypes, positions and layouts, error
// bounds per level, outliers, parallel decode, and rejection of corrupt or
// mismatched input.
//
// Only the public API is used, except in one test that re-seals a corrupted payload
// with the header writer of codec/bitstream.hpp so the decoder behind the checksum
// sees garbage (it must fail cleanly or succeed, never crash).
//
// Synthetic KV: per (layer, plane) a few AR(1) latent factors shared by all channels
// (so channels are correlated and tokens are correlated), per-channel offsets and
// scales, and K rotated with kvstream::rope_rotate at the token's position, so it
// looks like a real post-RoPE K.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "codec/bitstream.hpp"
#include "tests/codec/synthetic_kv.hpp"
#include "kvstream/codec.hpp"
#include "kvstream/dtype.hpp"
#include "kvstream/kv_model.hpp"
#include "kvstream/log.hpp"
#include <xxhash.h>

namespace kvstream::codec {
namespace {

// ---- Synthetic data ---------------------------------------------------------------

using test_util::fill_synthetic;
using test_util::keyed_unit;
using test_util::k_is_rotated;
using test_util::splitmix;

KvCache make_cache(const KvGeometry& g, DType dt, uint64_t tokens, uint64_t first_position, const RopeParams& rope,
                   uint64_t seed) {
  auto c = KvCache::create(g, dt, tokens, first_position);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  KvCache cache = std::move(c).value();
  cache.set_rope(rope);
  fill_synthetic(cache, rope, seed);
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

const std::vector<Case>& cases() {
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
void coding_row(const Profile& prof, const KvCache& c, uint32_t l, uint32_t p, uint64_t t, float* row) {
  const KvGeometry& g = c.geometry();
  for (uint32_t ch = 0; ch < g.channels(); ++ch) row[ch] = c.at(l, p, t, ch);
  if (prof.codes_k_before_rope() && p == 0)
    for (uint32_t h = 0; h < g.kv_heads; ++h)
      rope_rotate(row + size_t(h) * g.head_dim, g.head_dim, int64_t(c.first_position() + t), prof.rope(), true);
}

const Built& built(const Case& cs) {
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

const Case& case_named(const std::string& n) {
  for (const Case& c : cases())
    if (n == c.name) return c;
  std::abort();
}

// ---- Helpers -------------------------------------------------------------------------

std::vector<uint8_t> encode(const Profile& prof, const KvView& v, uint32_t level) {
  std::vector<uint8_t> out;
  const Status st = encode_chunk(prof, v, level, out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

bool same_bytes(const KvCache& a, const KvCache& b) {
  return a.bytes().size() == b.bytes().size() && std::memcmp(a.bytes().data(), b.bytes().data(), a.bytes().size()) == 0;
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A paged buffer in vLLM's per-layer layout [plane][block][slot][channel], with a
// scrambled block table; or, with `separate_kv`, K and V in tensors of their own per
// layer, [block][slot][head][dim] (NHD) or [block][head][slot][dim] (HND).
struct Paged {
  std::vector<std::vector<std::byte>> layers;
  KvView view;
  Paged(const KvGeometry& g, DType dt, uint64_t tokens, uint64_t first_position, uint32_t block_size, uint64_t seed,
        std::optional<PagedOrder> separate_kv = std::nullopt) {
    const uint64_t needed = (tokens + block_size - 1) / block_size, num_blocks = needed + 3;
    const int64_t C = g.channels();
    std::vector<uint32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0u);
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
    std::vector<uint32_t> table(perm.begin(), perm.begin() + needed);
    PagedLayout pl;
    if (separate_kv) {
      std::vector<void*> bases[2];
      for (uint32_t l = 0; l < g.layers; ++l)
        for (uint32_t p = 0; p < g.planes(); ++p) {
          layers.emplace_back(size_t(num_blocks) * block_size * C * dtype_size(dt), std::byte{0x5a});
          bases[p].push_back(layers.back().data());
        }
      pl = PagedLayout::blocks(*separate_kv, g, block_size, num_blocks, bases[0], bases[1], std::move(table));
    } else {
      pl.block_size = block_size;
      pl.slot_stride = C;
      pl.block_stride = int64_t(block_size) * C;
      pl.plane_stride = int64_t(num_blocks) * block_size * C;
      pl.channel_stride = 1;
      pl.num_blocks = num_blocks;
      pl.block_table = std::move(table);
      for (uint32_t l = 0; l < g.layers; ++l) {
        layers.emplace_back(size_t(pl.plane_stride) * g.planes() * dtype_size(dt), std::byte{0x5a});
        pl.layer_base.push_back(layers.back().data());
      }
    }
    auto v = KvView::paged(std::move(pl), dt, g, tokens, first_position);
    EXPECT_TRUE(v.ok()) << v.status().to_string();
    if (v.ok()) view = std::move(v).value();
  }
};

// Encodes `src` in chunks of `chunk` tokens at `level` and decodes each chunk into the
// matching slice of `out`.
void chunked_round_trip(const Profile& prof, const KvView& src, const KvView& out, uint32_t chunk, uint32_t level) {
  for (uint64_t b = 0; b < src.tokens(); b += chunk) {
    const TokenRange r{b, std::min<uint64_t>(src.tokens(), b + chunk)};
    const KvView in = src.slice(r).value();
    const std::vector<uint8_t> bytes = encode(prof, in, level);
    auto info = inspect_chunk(bytes);
    ASSERT_TRUE(info.ok()) << info.status().to_string();
    EXPECT_EQ(info->first_position, src.first_position() + b);
    EXPECT_EQ(info->tokens, r.size());
    const Status st = decode_chunk(prof, bytes, out.slice(r).value());
    ASSERT_TRUE(st.ok()) << "chunk [" << r.begin << ", " << r.end << ") level " << level << ": " << st.to_string();
  }
}

struct ErrorStats {
  double max_row_excess = -1e300;  // max over rows of (||e_row|| - bound); must be <= 0
  double sum_abs = 0, sum_sq = 0, count = 0;
  std::string worst;
};

// Checks decoded (f32) against the source, row by row: ||x - x^||_2 over a row of a
// (layer, plane) is at most step/2 * sqrt(sum_c var_c). That is what per-channel
// steps of step * sigma_c give (|e_c| <= step * sigma_c / 2), and it also holds for
// any orthogonal transform whose coefficients are quantized with steps proportional
// to their deviations, since the sum of variances is invariant. RoPE is orthogonal
// too, so the bound holds for rotated K. Rows listed in `skip` are not checked.
ErrorStats check_rows(const Built& b, const KvCache& src, const KvCache& dec, uint32_t level,
                      const std::vector<std::tuple<uint32_t, uint32_t, uint64_t>>& skip = {}) {
  ErrorStats s;
  const KvGeometry& g = src.geometry();
  const float step = b.profile.level(level).step;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p) {
      const double bound_base = 0.5 * step * std::sqrt(b.sum_var[size_t(l) * g.planes() + p]) * 1.01;
      for (uint64_t t = 0; t < src.tokens(); ++t) {
        if (std::find(skip.begin(), skip.end(), std::make_tuple(l, p, t)) != skip.end()) continue;
        double e2 = 0, amax = 0;
        for (uint32_t c = 0; c < g.channels(); ++c) {
          const double x = src.at(l, p, t, c), y = dec.at(l, p, t, c);
          const double e = x - y;
          e2 += e * e;
          amax = std::max(amax, std::fabs(x));
          s.sum_abs += std::fabs(e), s.sum_sq += e * e, s.count += 1;
        }
        const double bound = bound_base + 1e-5 * std::sqrt(double(g.channels())) * (1.0 + amax);
        const double excess = std::sqrt(e2) - bound;
        if (excess > s.max_row_excess) {
          s.max_row_excess = excess;
          s.worst = fmt::format("layer {} plane {} token {}: |e| = {:.6g}, bound {:.6g}", l, p, t, std::sqrt(e2), bound);
        }
      }
    }
  return s;
}

class CodecCase : public ::testing::TestWithParam<std::string> {
 protected:
  const Case& cs() const { return case_named(GetParam()); }
};

std::string case_name(const ::testing::TestParamInfo<std::string>& i) { return i.param; }
std::vector<std::string> case_names() {
  std::vector<std::string> n;
  for (const Case& c : cases()) n.push_back(c.name);
  return n;
}

// ---- 1. Round trips ------------------------------------------------------------------

TEST_P(CodecCase, ProfileDescribesItself) {
  const Built& b = built(cs());
  const Profile& p = b.profile;
  EXPECT_EQ(p.geometry(), cs().geom);
  EXPECT_EQ(p.rope(), cs().rope);
  EXPECT_EQ(p.group_size(), cs().group_size);
  EXPECT_EQ(p.codes_k_before_rope(), cs().rope.enabled && cs().code_k_before_rope &&
                                         cs().geom.kind != AttentionKind::mla);
  ASSERT_EQ(p.levels(), ProfileOptions{}.level_steps.size());
  for (uint32_t i = 0; i < p.levels(); ++i) {
    EXPECT_EQ(p.level(i).step, ProfileOptions{}.level_steps[i]);
    EXPECT_GT(p.level(i).bits_per_element, 0.0);
    EXPECT_LT(p.level(i).bits_per_element, 32.0);
    if (i > 0) EXPECT_LE(p.level(i).bits_per_element, p.level(i - 1).bits_per_element * 1.02) << "level " << i;
  }
  const auto counts = p.predictor_counts();
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_EQ(counts[0] + counts[1] + counts[2], uint64_t(cs().geom.layers) * cs().geom.planes() * cs().geom.channels());
  for (uint32_t l = 0; l < cs().geom.layers; ++l)
    for (uint32_t pl = 0; pl < cs().geom.planes(); ++pl)
      for (uint32_t c = 0; c < cs().geom.channels(); ++c) EXPECT_LE(uint8_t(p.predictor(l, pl, c)), 2);
}

// 100 tokens in chunks of 37 (so the last chunk is short and every chunk boundary
// splits an anchor group), at position 0 and at 1000; every level; sources in every
// dtype; outputs in every dtype, packed and paged.
TEST_P(CodecCase, RoundTripEveryLevelDtypeAndLayout) {
  const Built& b = built(cs());
  const KvGeometry& g = cs().geom;
  const uint32_t L = b.profile.levels();
  for (uint64_t first : {uint64_t(0), uint64_t(1000)}) {
    for (DType sdt : {DType::f32, DType::f16, DType::bf16}) {
      const KvCache src = make_cache(g, sdt, 100, first, cs().rope, 100 + first + uint64_t(sdt));
      std::vector<double> mae(L);
      for (uint32_t level = 0; level < L; ++level) {
        SCOPED_TRACE(fmt::format("first {} src {} level {}", first, dtype_name(sdt), level));
        KvCache ref = KvCache::create(g, DType::f32, 100, first).value();
        chunked_round_trip(b.profile, src.view(), ref.view(), 37, level);
        const ErrorStats es = check_rows(b, src, ref, level);
        EXPECT_LE(es.max_row_excess, 0.0) << es.worst;
        mae[level] = es.sum_abs / es.count;
        // Every output dtype: the decode is the f32 decode rounded to that dtype.
        for (DType odt : {DType::f16, DType::bf16}) {
          KvCache out = KvCache::create(g, odt, 100, first).value();
          chunked_round_trip(b.profile, src.view(), out.view(), 37, level);
          KvCache want = KvCache::create(g, odt, 100, first).value();
          ASSERT_TRUE(copy_kv(ref.view(), want.view()).ok());
          EXPECT_TRUE(same_bytes(out, want)) << "output " << dtype_name(odt) << " != rounded f32 output";
        }
        // Paged output (block size 16, scrambled; one tensor per layer, or K and V
        // apart in NHD and HND blocks) equals the packed output bit for bit.
        if (level % 3 == 0 || level == L - 1) {
          const std::optional<PagedOrder> kinds[] = {std::nullopt, PagedOrder::nhd, PagedOrder::hnd};
          for (DType odt : {DType::f32, DType::bf16})
            for (const auto& kind : kinds) {
              if (kind && g.planes() != 2) continue;  // MLA has no V plane
              Paged pg(g, odt, 100, first, 16, level + 7, kind);
              chunked_round_trip(b.profile, src.view(), pg.view, 37, level);
              KvCache packed = KvCache::create(g, odt, 100, first).value();
              chunked_round_trip(b.profile, src.view(), packed.view(), 37, level);
              KvCache gathered = KvCache::create(g, odt, 100, first).value();
              ASSERT_TRUE(copy_kv(pg.view, gathered.view()).ok());
              EXPECT_TRUE(same_bytes(gathered, packed))
                  << "paged " << dtype_name(odt) << (kind ? (*kind == PagedOrder::hnd ? " HND" : " NHD") : "")
                  << " output != packed";
            }
        }
      }
      // Coarser levels make larger errors.
      for (uint32_t i = 1; i < L; ++i)
        EXPECT_GE(mae[i], mae[i - 1]) << "first " << first << " src " << dtype_name(sdt) << " level " << i;
    }
  }
}

// The bitstream does not depend on the source's layout: packed, paged and strided
// sources of the same values encode to the same bytes. Encoding is deterministic and
// appends to `out`.
TEST_P(CodecCase, EncodeIsDeterministicAndLayoutIndependent) {
  const Built& b = built(cs());
  const KvGeometry& g = cs().geom;
  const KvCache src = make_cache(g, DType::f16, 45, 77, cs().rope, 5);
  const uint32_t level = 2;
  const std::vector<uint8_t> a = encode(b.profile, src.view(), level);
  EXPECT_EQ(encode(b.profile, src.view(), level), a);

  Paged pg(g, DType::f16, 45, 77, 8, 3);
  ASSERT_TRUE(copy_kv(src.view(), pg.view).ok());
  EXPECT_EQ(encode(b.profile, pg.view, level), a) << "paged source";

  // Strided: token-major [token][layer][plane][channel] with 3 padding elements per token.
  const int64_t C = g.channels();
  KvStrides st;
  st.channel = 1;
  st.plane = C;
  st.layer = C * g.planes();
  st.token = C * g.planes() * g.layers + 3;
  std::vector<uint16_t> mem(size_t(st.token) * 45, 0);
  auto sv = KvView::strided(mem.data(), DType::f16, g, 45, st, 77);
  ASSERT_TRUE(sv.ok()) << sv.status().to_string();
  ASSERT_TRUE(copy_kv(src.view(), *sv).ok());
  EXPECT_EQ(encode(b.profile, *sv, level), a) << "strided source";

  std::vector<uint8_t> appended = {1, 2, 3};
  ASSERT_TRUE(encode_chunk(b.profile, src.view(), level, appended).ok());
  ASSERT_EQ(appended.size(), a.size() + 3);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), appended.begin() + 3));
  EXPECT_EQ(appended[0], 1);

  auto info = inspect_chunk(a);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->geometry, g);
  EXPECT_EQ(info->dtype, DType::f16);
  EXPECT_EQ(info->first_position, 77u);
  EXPECT_EQ(info->tokens, 45u);
  EXPECT_EQ(info->level, level);
  EXPECT_EQ(info->profile_hash, b.profile.hash());
  EXPECT_EQ(info->total_bytes, a.size());

  // Coarser levels give smaller chunks.
  size_t prev = SIZE_MAX;
  for (uint32_t l = 0; l < b.profile.levels(); ++l) {
    const size_t n = encode(b.profile, src.view(), l).size();
    EXPECT_LE(n, prev) << "level " << l;
    prev = n;
  }
}

// ---- 2. Error bounds, near-losslessness, outliers -----------------------------------

TEST_P(CodecCase, LevelZeroIsNearLossless) {
  const Built& b = built(cs());
  const KvGeometry& g = cs().geom;
  const KvCache src = make_cache(g, DType::f32, 80, 20, cs().rope, 21);
  KvCache dec = KvCache::create(g, DType::f32, 80, 20).value();
  ASSERT_TRUE(decode_chunk(b.profile, encode(b.profile, src.view(), 0), dec.view()).ok());
  const ErrorStats es = check_rows(b, src, dec, 0);
  EXPECT_LE(es.max_row_excess, 0.0) << es.worst;
  double var_total = 0;
  for (double v : b.sum_var) var_total += v;
  const double mean_var = var_total / double(b.sum_var.size() * g.channels());
  const double rmse = std::sqrt(es.sum_sq / es.count);
  EXPECT_LT(rmse, 0.05 * std::sqrt(mean_var)) << "rmse " << rmse << " std " << std::sqrt(mean_var);
}

// Values far beyond the symbol range (1e4 against unit-scale data) come back exactly
// (to the output dtype), including at the first token of an anchor group, and their
// neighbours still meet the bound. In a rotated K plane the outlier is coded before
// RoPE, so it comes back within rotation round-off.
TEST_P(CodecCase, OutliersComeBackExactly) {
  const Built& b = built(cs());
  const KvGeometry& g = cs().geom;
  const uint32_t C = g.channels(), P = g.planes();
  KvCache src = make_cache(g, DType::f32, 50, 9, cs().rope, 33);
  struct Spot { uint32_t l, p; uint64_t t; uint32_t c; float v; };
  std::vector<Spot> spots = {{0, P - 1, 0, 3, 1e4f}, {0, P - 1, 13, C - 1, -1e4f}, {g.layers - 1, 0, 20, C / 2, 1e4f},
                             {g.layers - 1, P - 1, 49, 0, 12345.678f}};
  std::vector<std::tuple<uint32_t, uint32_t, uint64_t>> rows;
  for (const Spot& s : spots) src.set(s.l, s.p, s.t, s.c, s.v), rows.emplace_back(s.l, s.p, s.t);
  for (uint32_t level : {0u, b.profile.levels() - 1}) {
    const std::vector<uint8_t> bytes = encode(b.profile, src.view(), level);
    for (DType odt : {DType::f32, DType::f16, DType::bf16}) {
      KvCache dec = KvCache::create(g, odt, 50, 9).value();
      ASSERT_TRUE(decode_chunk(b.profile, bytes, dec.view()).ok());
      for (const Spot& s : spots) {
        float want = s.v;
        store_element(&want, odt, 0, s.v);  // rounded to the output type...
        want = load_element(&want, odt, 0);  // ...and read back
        const float got = dec.at(s.l, s.p, s.t, s.c);
        if (k_is_rotated(g, cs().rope, s.p) && b.profile.codes_k_before_rope())
          EXPECT_NEAR(got, want, 1e-5 * 1e4 + std::fabs(want) * 0.008 + 0.5)
              << dtype_name(odt) << " level " << level << " rotated K outlier at token " << s.t;
        else
          EXPECT_EQ(got, want) << dtype_name(odt) << " level " << level << " outlier at layer " << s.l << " plane "
                               << s.p << " token " << s.t << " channel " << s.c
                               << fmt::format(": got {:.9g}, want {:.9g}", got, want);
      }
      if (odt == DType::f32) {
        const ErrorStats es = check_rows(b, src, dec, level, rows);
        EXPECT_LE(es.max_row_excess, 0.0) << "level " << level << ": " << es.worst;
      }
    }
  }
}

// ---- 3. Parallel decode, scratch reuse -------------------------------------------------

// A decoder's scratch keeps its RoPE table across chunks; chunks at positions where
// first + tokens wraps (headers are untrusted) must not be taken as covered by it.
TEST_P(CodecCase, ScratchReusedAcrossChunksAtAnyPosition) {
  const Built& b = built(cs());
  const KvGeometry& g = cs().geom;
  DecodeScratch scratch;
  for (uint64_t first : {uint64_t(0), uint64_t(40), ~uint64_t(0) - 20, uint64_t(7), ~uint64_t(0) - 3}) {
    const KvCache src = make_cache(g, DType::f32, 32, first, cs().rope, first + 1);
    const std::vector<uint8_t> bytes = encode(b.profile, src.view(), 3);
    KvCache fresh = KvCache::create(g, DType::f32, 32, first).value();
    ASSERT_TRUE(decode_chunk(b.profile, bytes, fresh.view()).ok());
    KvCache reused = KvCache::create(g, DType::f32, 32, first).value();
    ASSERT_TRUE(decode_chunk(b.profile, bytes, reused.view(), &scratch).ok());
    EXPECT_TRUE(same_bytes(fresh, reused)) << "first position " << first;
  }
}

TEST_P(CodecCase, ParallelDecodeAndScratchMatchSerialBitForBit) {
  const Built& b = built(cs());
  const KvGeometry& g = cs().geom;
  DecodeScratch scratch;
  for (uint32_t tokens : {1u, 23u, 64u}) {
    const KvCache src = make_cache(g, DType::bf16, tokens, 500, cs().rope, tokens);
    for (uint32_t level : {0u, 4u}) {
      const std::vector<uint8_t> bytes = encode(b.profile, src.view(), level);
      KvCache serial = KvCache::create(g, DType::f32, tokens, 500).value();
      ASSERT_TRUE(decode_chunk(b.profile, bytes, serial.view()).ok());
      KvCache reused = KvCache::create(g, DType::f32, tokens, 500).value();
      ASSERT_TRUE(decode_chunk(b.profile, bytes, reused.view(), &scratch).ok());
      EXPECT_TRUE(same_bytes(serial, reused)) << "scratch, " << tokens << " tokens level " << level;
      for (unsigned threads : {0u, 1u, 2u, 3u, 8u}) {
        KvCache par = KvCache::create(g, DType::f32, tokens, 500).value();
        const Status st = decode_chunk_parallel(b.profile, bytes, par.view(), threads);
        ASSERT_TRUE(st.ok()) << threads << " threads: " << st.to_string();
        EXPECT_TRUE(same_bytes(serial, par)) << threads << " threads, " << tokens << " tokens level " << level;
      }
      Paged pg(g, DType::f16, tokens, 500, 4, level);
      ASSERT_TRUE(decode_chunk_parallel(b.profile, bytes, pg.view, 3).ok());
      KvCache gathered = KvCache::create(g, DType::f16, tokens, 500).value();
      ASSERT_TRUE(copy_kv(pg.view, gathered.view()).ok());
      KvCache want = KvCache::create(g, DType::f16, tokens, 500).value();
      ASSERT_TRUE(copy_kv(serial.view(), want.view()).ok());
      EXPECT_TRUE(same_bytes(gathered, want)) << "parallel paged f16";
      if (g.planes() == 2) {  // K and V apart, HND blocks: rows of heads that lie apart
        Paged hnd(g, DType::f16, tokens, 500, 4, level, PagedOrder::hnd);
        ASSERT_TRUE(decode_chunk_parallel(b.profile, bytes, hnd.view, 3).ok());
        ASSERT_TRUE(copy_kv(hnd.view, gathered.view()).ok());
        EXPECT_TRUE(same_bytes(gathered, want)) << "parallel paged HND f16";
      }
    }
  }
}

// ---- 5. Non-finite input ---------------------------------------------------------------

TEST_P(CodecCase, NonFiniteInputIsAClearError) {
  const Built& b = built(cs());
  const KvGeometry& g = cs().geom;
  const uint32_t P = g.planes();
  struct Bad { DType dt; uint32_t plane; float v; };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const Bad& bad : {Bad{DType::f32, P - 1, nan}, Bad{DType::f32, 0, inf}, Bad{DType::f32, 0, -inf},
                         Bad{DType::f16, P - 1, inf}, Bad{DType::bf16, 0, nan}, Bad{DType::f16, P - 1, -inf}}) {
    KvCache src = make_cache(g, bad.dt, 12, 40, cs().rope, 8);
    src.set(g.layers - 1, bad.plane, 5, 3, bad.v);
    for (uint32_t level : {0u, b.profile.levels() - 1}) {
      std::vector<uint8_t> out = {9, 9};
      const Status st = encode_chunk(b.profile, src.view(), level, out);
      const std::string what = fmt::format("{} {} plane {} level {}", dtype_name(bad.dt), bad.v, bad.plane, level);
      EXPECT_EQ(st.code(), StatusCode::invalid_argument) << what << ": " << st.to_string();
      const std::string m = lower(st.message());
      EXPECT_TRUE(contains(m, "finite") || contains(m, "nan") || contains(m, "inf")) << what << ": " << m;
      EXPECT_EQ(out, (std::vector<uint8_t>{9, 9})) << what << ": output written on error";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Geometries, CodecCase, ::testing::ValuesIn(case_names()), case_name);

// ---- 4. Corrupt and mismatched input ------------------------------------------------

struct Small {
  const Built* b;
  KvCache src;
  std::vector<uint8_t> bytes;
};
Small small_chunk() {
  const Case& cs = case_named("gqa_rope_interleaved");
  const Built& b = built(cs);
  Small s{&b, make_cache(cs.geom, DType::f16, 5, 3, cs.rope, 99), {}};
  s.bytes = encode(b.profile, s.src.view(), 3);
  return s;
}

// Decodes into a sentinel-filled output and checks the output was not touched.
Status decode_untouched(const Profile& prof, std::span<const uint8_t> bytes, const KvGeometry& g, uint64_t tokens,
                        bool* touched) {
  KvCache out = KvCache::create(g, DType::f32, tokens).value();
  std::memset(out.bytes().data(), 0x7b, out.bytes().size());
  const Status st = decode_chunk(prof, bytes, out.view());
  *touched = false;
  for (std::byte x : out.bytes()) *touched |= x != std::byte{0x7b};
  return st;
}

TEST(CodecCorrupt, TruncationAtEveryOffsetFails) {
  const Small s = small_chunk();
  const KvGeometry& g = s.src.geometry();
  ASSERT_GT(s.bytes.size(), 100u);
  for (size_t n = 0; n < s.bytes.size(); ++n) {
    const std::span<const uint8_t> cut(s.bytes.data(), n);
    bool touched;
    const Status st = decode_untouched(s.b->profile, cut, g, 5, &touched);
    ASSERT_EQ(st.code(), StatusCode::corrupt_data) << "truncated to " << n << ": " << st.to_string();
    ASSERT_FALSE(touched) << "truncated to " << n;
    ASSERT_FALSE(inspect_chunk(cut).ok()) << n;
    KvCache out = KvCache::create(g, DType::f32, 5).value();
    ASSERT_FALSE(decode_chunk_parallel(s.b->profile, cut, out.view(), 2).ok()) << n;
  }
  // Extra bytes at the end are corruption too.
  std::vector<uint8_t> longer = s.bytes;
  longer.push_back(0);
  bool touched;
  EXPECT_EQ(decode_untouched(s.b->profile, longer, g, 5, &touched).code(), StatusCode::corrupt_data);
  EXPECT_FALSE(touched);
}

TEST(CodecCorrupt, EveryHeaderBitFlipFails) {
  const Small s = small_chunk();
  const KvGeometry& g = s.src.geometry();
  const size_t header = 64 + size_t(g.layers) * g.planes() * 4;  // fixed header + substream length table
  ASSERT_LT(header, s.bytes.size());
  for (size_t i = 0; i < header; ++i)
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> c = s.bytes;
      c[i] ^= uint8_t(1u << bit);
      bool touched;
      const Status st = decode_untouched(s.b->profile, c, g, 5, &touched);
      ASSERT_FALSE(st.ok()) << "byte " << i << " bit " << bit;
      ASSERT_FALSE(touched) << "byte " << i << " bit " << bit;
    }
}

TEST(CodecCorrupt, PayloadCorruptionIsCaughtByTheChecksum) {
  const Small s = small_chunk();
  const KvGeometry& g = s.src.geometry();
  const size_t header = 64 + size_t(g.layers) * g.planes() * 4;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 400; ++i) {
    std::vector<uint8_t> c = s.bytes;
    const int n = 1 + int(rng() % 3);
    for (int k = 0; k < n; ++k) c[header + rng() % (c.size() - header)] ^= uint8_t(1 + rng() % 255);
    bool touched;
    const Status st = decode_untouched(s.b->profile, c, g, 5, &touched);
    ASSERT_EQ(st.code(), StatusCode::corrupt_data) << "try " << i << ": " << st.to_string();
    ASSERT_FALSE(touched) << "try " << i;
  }
}

// Behind the checksum: corrupt the payload and re-seal the header (valid checksums),
// so the substream parser and rANS decoder see garbage. Decoding must fail cleanly or
// succeed; it must never crash or hang (run under ASan/UBSan in the fuzz build too).
TEST(CodecCorrupt, ResealedGarbagePayloadNeverCrashes) {
  const Small s = small_chunk();
  size_t payload = 0;
  auto h = parse_header(s.bytes, &payload);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  std::mt19937_64 rng(11);
  int failed = 0;
  for (int i = 0; i < 500; ++i) {
    std::vector<uint8_t> c = s.bytes;
    const int n = 1 + int(rng() % 4);
    for (int k = 0; k < n; ++k) c[payload + rng() % (c.size() - payload)] ^= uint8_t(1 + rng() % 255);
    finish_header(c, 0, *h);
    ASSERT_TRUE(inspect_chunk(c).ok()) << "re-sealing did not produce a valid header";
    KvCache out = KvCache::create(s.src.geometry(), DType::f32, 5).value();
    const Status st = decode_chunk(s.b->profile, c, out.view());
    if (!st.ok()) {
      ++failed;
      EXPECT_EQ(st.code(), StatusCode::corrupt_data) << st.to_string();
    }
    KvCache par = KvCache::create(s.src.geometry(), DType::f32, 5).value();
    const Status st2 = decode_chunk_parallel(s.b->profile, c, par.view(), 2);
    EXPECT_EQ(st.ok(), st2.ok()) << st.to_string() << " vs " << st2.to_string();
    if (st.ok() && st2.ok()) EXPECT_TRUE(same_bytes(out, par)) << "try " << i;
  }
  EXPECT_GT(failed, 400) << "most garbage payloads should be detected";
}

TEST(CodecCorrupt, DifferentProfileIsRejectedByHash) {
  const Small s = small_chunk();
  const Case& cs = case_named("gqa_rope_interleaved");
  // Same geometry and RoPE, different samples: a different profile.
  const KvCache other_sample = make_cache(cs.geom, DType::f32, 40, 0, cs.rope, 4242);
  ProfileOptions opt;
  opt.level_steps = {0.1f, 0.3f, 0.9f, 1.5f};
  opt.max_tables_per_level = 4;
  const KvView v = other_sample.view();
  auto other = ProfileBuilder::build({&v, 1}, cs.rope, opt);
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  ASSERT_NE(other->hash(), s.b->profile.hash());
  bool touched;
  const Status st = decode_untouched(*other, s.bytes, cs.geom, 5, &touched);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st.to_string();
  EXPECT_TRUE(contains(st.message(), fmt::format("{:x}", s.b->profile.hash()))) << st.message();
  EXPECT_FALSE(touched);
  KvCache out = KvCache::create(cs.geom, DType::f32, 5).value();
  EXPECT_EQ(decode_chunk_parallel(*other, s.bytes, out.view(), 4).code(), StatusCode::invalid_argument);
}

TEST(CodecCorrupt, WrongOutputGeometryOrTokensIsInvalidArgument) {
  const Small s = small_chunk();
  const KvGeometry& g = s.src.geometry();
  bool touched;
  for (uint64_t tokens : {4u, 6u, 1u}) {
    const Status st = decode_untouched(s.b->profile, s.bytes, g, tokens, &touched);
    EXPECT_EQ(st.code(), StatusCode::invalid_argument) << tokens << " tokens: " << st.to_string();
    EXPECT_FALSE(touched);
  }
  KvGeometry more_layers = g;
  more_layers.layers += 1;
  KvGeometry other_heads = g;
  other_heads.kv_heads = 1, other_heads.head_dim *= 2;  // same channel count, other shape
  for (const KvGeometry& wrong : {more_layers, other_heads}) {
    const Status st = decode_untouched(s.b->profile, s.bytes, wrong, 5, &touched);
    EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st.to_string();
    EXPECT_FALSE(touched);
    KvCache out = KvCache::create(wrong, DType::f32, 5).value();
    EXPECT_EQ(decode_chunk_parallel(s.b->profile, s.bytes, out.view(), 2).code(), StatusCode::invalid_argument);
  }
}

TEST(CodecCorrupt, EncodeRejectsBadArguments) {
  const Small s = small_chunk();
  const Profile& p = s.b->profile;
  std::vector<uint8_t> out;
  EXPECT_EQ(encode_chunk(p, s.src.view(), p.levels(), out).code(), StatusCode::out_of_range);
  EXPECT_EQ(encode_chunk(p, s.src.view(), 1000, out).code(), StatusCode::out_of_range);
  const KvCache wrong = make_cache({2, 4, 16, 4, AttentionKind::mha}, DType::f32, 5, 0, {}, 1);
  EXPECT_EQ(encode_chunk(p, wrong.view(), 0, out).code(), StatusCode::invalid_argument);
  const KvView empty = s.src.view().slice({2, 2}).value();
  EXPECT_EQ(encode_chunk(p, empty, 0, out).code(), StatusCode::invalid_argument);
  EXPECT_TRUE(out.empty());
}

// ---- Profiles: serialization, files, corruption, builder errors ----------------------

Profile small_profile() {
  const Case& cs = case_named("gqa_rope_half_partial");
  set_log_level(LogLevel::warn);
  const KvCache sample = make_cache(cs.geom, DType::f32, 40, 0, cs.rope, 77);
  ProfileOptions opt;
  opt.level_steps = {0.1f, 0.4f, 1.0f};
  opt.max_tables_per_level = 3;
  const KvView v = sample.view();
  return ProfileBuilder::build({&v, 1}, cs.rope, opt).value();
}

TEST(CodecProfile, SerializeLoadAndFileRoundTrip) {
  const Built& b = built(case_named("gqa_rope_half_partial"));
  const std::vector<uint8_t> ser = b.profile.serialize();
  auto loaded = Profile::load(ser);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->hash(), b.profile.hash());
  EXPECT_EQ(loaded->serialize(), ser);
  EXPECT_EQ(loaded->geometry(), b.profile.geometry());
  EXPECT_EQ(loaded->rope(), b.profile.rope());
  EXPECT_EQ(loaded->codes_k_before_rope(), b.profile.codes_k_before_rope());
  EXPECT_EQ(loaded->levels(), b.profile.levels());
  for (uint32_t i = 0; i < b.profile.levels(); ++i) {
    EXPECT_EQ(loaded->level(i).step, b.profile.level(i).step);
    EXPECT_EQ(loaded->level(i).bits_per_element, b.profile.level(i).bits_per_element);
  }

  const std::string path = ::testing::TempDir() + fmt::format("kvstream_test_codec_{}.kvsp", ::getpid());
  ASSERT_TRUE(b.profile.save_file(path).ok());
  auto from_file = Profile::load_file(path);
  std::remove(path.c_str());
  ASSERT_TRUE(from_file.ok()) << from_file.status().to_string();
  EXPECT_EQ(from_file->hash(), b.profile.hash());

  // A chunk encoded with the original decodes identically with the loaded copies.
  const Case& cs = case_named("gqa_rope_half_partial");
  const KvCache src = make_cache(cs.geom, DType::f32, 30, 123, cs.rope, 3);
  const std::vector<uint8_t> bytes = encode(b.profile, src.view(), 1);
  KvCache a = KvCache::create(cs.geom, DType::f32, 30, 123).value();
  KvCache c = KvCache::create(cs.geom, DType::f32, 30, 123).value();
  ASSERT_TRUE(decode_chunk(b.profile, bytes, a.view()).ok());
  ASSERT_TRUE(decode_chunk(*from_file, bytes, c.view()).ok());
  EXPECT_TRUE(same_bytes(a, c));
  EXPECT_EQ(encode(*from_file, src.view(), 1), bytes);

  // Copies are independent and equal.
  Profile copy = b.profile;
  EXPECT_EQ(copy.hash(), b.profile.hash());
  EXPECT_EQ(copy.serialize(), ser);

  EXPECT_EQ(Profile::load_file(path + ".does-not-exist").status().code(), StatusCode::not_found);
}

TEST(CodecProfile, EveryByteFlipAndTruncationFailsToLoad) {
  const Profile p = small_profile();
  const std::vector<uint8_t> ser = p.serialize();
  ASSERT_TRUE(Profile::load(ser).ok());
  for (size_t i = 0; i < ser.size(); ++i) {
    std::vector<uint8_t> c = ser;
    c[i] ^= uint8_t(1u << (i % 8));
    ASSERT_FALSE(Profile::load(c).ok()) << "flipped byte " << i << " of " << ser.size();
  }
  for (size_t n = 0; n < ser.size(); n += (n < 64 ? 1 : 7))
    ASSERT_FALSE(Profile::load(std::span<const uint8_t>(ser.data(), n)).ok()) << "truncated to " << n;
  std::vector<uint8_t> longer = ser;
  longer.push_back(0);
  EXPECT_FALSE(Profile::load(longer).ok());
}

// A body with a non-canonical boolean byte (2 instead of 1) under a matching content
// hash (a crafted file, or one edited and re-hashed) is bad input: load must reject it
// as corrupt_data, never answer `internal` (which means a kvstream bug). Found by
// fuzz_profile_loader. Offsets follow Profile::serialize: a 24-byte head ("KVSP",
// version, hash, body size), then layers, kv_heads, head_dim, q_heads (u32), kind (u8),
// rope.enabled (u8), rope.base (f32), rotary_dim (u32), pairing (u8), k_before_rope (u8).
TEST(CodecProfile, NonCanonicalBodyIsCorruptNotInternal) {
  const Profile p = small_profile();  // RoPE enabled, K coded before RoPE
  const std::vector<uint8_t> ser = p.serialize();
  constexpr size_t kHead = 24, kRopeEnabled = kHead + 17, kKBeforeRope = kRopeEnabled + 1 + 4 + 4 + 1;
  if (ser.size() <= kKBeforeRope || ser[kRopeEnabled] != 1 || ser[kKBeforeRope] != 1)
    GTEST_SKIP() << "profile layout changed; update the offsets of this test";
  for (size_t at : {kRopeEnabled, kKBeforeRope})
    for (uint8_t v : {2, 255}) {
      std::vector<uint8_t> b = ser;
      b[at] = v;
      const uint64_t h = XXH3_64bits(b.data() + kHead, b.size() - kHead);
      std::memcpy(b.data() + 8, &h, 8);
      auto r = Profile::load(b);
      EXPECT_FALSE(r.ok()) << "byte " << at << " = " << int(v);
      EXPECT_NE(r.status().code(), StatusCode::internal) << "byte " << at << " = " << int(v) << ": "
                                                         << r.status().to_string();
    }
}

TEST(CodecProfile, LevelQualityChangesTheHash) {
  Profile p = small_profile();
  const uint64_t h0 = p.hash();
  const Case& cs = case_named("gqa_rope_half_partial");
  const KvCache src = make_cache(cs.geom, DType::f32, 12, 0, cs.rope, 5);
  const std::vector<uint8_t> bytes = encode(p, src.view(), 0);
  ASSERT_TRUE(p.set_level_quality(1, 0.5, 0.01).ok());
  EXPECT_NE(p.hash(), h0);
  EXPECT_EQ(p.level(1).ppl_increase_pct, 0.5);
  EXPECT_EQ(p.level(1).kl_nats, 0.01);
  EXPECT_EQ(p.set_level_quality(p.levels(), 1, 1).code(), StatusCode::out_of_range);
  EXPECT_EQ(p.set_level_quality(1, 1, 1, -0.5).code(), StatusCode::invalid_argument);
  EXPECT_EQ(p.set_level_quality(1, 1, 1, NAN).code(), StatusCode::invalid_argument);
  KvCache out = KvCache::create(cs.geom, DType::f32, 12).value();
  EXPECT_EQ(decode_chunk(p, bytes, out.view()).code(), StatusCode::invalid_argument);
  auto re = Profile::load(p.serialize());
  ASSERT_TRUE(re.ok());
  EXPECT_EQ(re->hash(), p.hash());
  EXPECT_EQ(re->level(1).ppl_increase_pct, 0.5);
}

TEST(CodecProfile, BuilderRejectsBadOptions) {
  set_log_level(LogLevel::warn);
  const Case& cs = case_named("mha");
  const KvCache a = make_cache(cs.geom, DType::f32, 20, 0, {}, 1);
  const KvCache other = make_cache({1, 4, 16, 4, AttentionKind::mha}, DType::f32, 20, 0, {}, 1);
  const KvView va = a.view();
  const KvView mixed[2] = {a.view(), other.view()};
  EXPECT_EQ(ProfileBuilder::build({}, {}, {}).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(ProfileBuilder::build(mixed, {}, {}).status().code(), StatusCode::invalid_argument);
  ProfileOptions o;
  o.level_steps = {};
  EXPECT_FALSE(ProfileBuilder::build({&va, 1}, {}, o).ok());
  o.level_steps = {0.1f, 0.0f};
  EXPECT_FALSE(ProfileBuilder::build({&va, 1}, {}, o).ok());
  o.level_steps = {0.1f, -1.0f};
  EXPECT_FALSE(ProfileBuilder::build({&va, 1}, {}, o).ok());
  o = {};
  o.group_size = 0;
  EXPECT_FALSE(ProfileBuilder::build({&va, 1}, {}, o).ok());
  o = {};
  o.channel_weights = {1.0f, 2.0f};
  EXPECT_FALSE(ProfileBuilder::build({&va, 1}, {}, o).ok());
  o = {};
  o.max_tables_per_level = 0;
  EXPECT_FALSE(ProfileBuilder::build({&va, 1}, {}, o).ok());
}

TEST(CodecProfile, MlaNeverUndoesRope) {
  set_log_level(LogLevel::warn);
  const KvGeometry g{1, 1, 32, 8, AttentionKind::mla};
  const RopeParams rope{true, 10000.0f, 0, RopePairing::interleaved};
  const KvCache a = make_cache(g, DType::f32, 30, 0, rope, 2);  // fill_synthetic never rotates MLA
  const KvView v = a.view();
  ProfileOptions o;
  o.level_steps = {0.05f, 0.5f};
  o.max_tables_per_level = 2;
  auto p = ProfileBuilder::build({&v, 1}, rope, o);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_FALSE(p->codes_k_before_rope());
  KvCache out = KvCache::create(g, DType::f32, 30).value();
  ASSERT_TRUE(decode_chunk(*p, encode(*p, v, 0), out.view()).ok());
  double max_err = 0;
  for (uint64_t t = 0; t < 30; ++t)
    for (uint32_t c = 0; c < 32; ++c) max_err = std::max(max_err, double(std::fabs(a.at(0, 0, t, c) - out.at(0, 0, t, c))));
  EXPECT_LT(max_err, 0.1);
}

}  // namespace
}  // namespace kvstream::codec

TEST(CodecChunks, RangesCoverTheContext) {
  using kvstream::codec::chunk_ranges;
  EXPECT_TRUE(chunk_ranges(0).empty());
  EXPECT_TRUE(chunk_ranges(100, 0).empty());
  const auto r = chunk_ranges(4000);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], (kvstream::TokenRange{0, 1536}));
  EXPECT_EQ(r[2], (kvstream::TokenRange{3072, 4000}));
  const auto s = chunk_ranges(100, 37);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[2], (kvstream::TokenRange{74, 100}));
}

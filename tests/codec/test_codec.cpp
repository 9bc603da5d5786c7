// Tests for the public codec API (include/kvstream/codec.hpp) over every case of
// codec_cases.hpp: the profile a case builds describes itself; chunks round-trip over
// dtypes, positions and packed, paged and strided layouts; every level keeps its error
// bound, level 0 is near lossless and outliers come back exactly; parallel decode and
// a reused scratch match the serial decode bit for bit; and non-finite input is a
// clear error. These are the properties every caller of the codec relies on, so they
// are checked for each geometry and RoPE variant rather than for one.
//
// Corrupt and mismatched chunks are in test_codec_corrupt.cpp, profile serialization
// and the builder's errors in test_codec_profile.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kvstream/codec.hpp"
#include "kvstream/dtype.hpp"
#include "kvstream/kv_model.hpp"
#include "tests/codec/codec_cases.hpp"
#include "tests/codec/synthetic_kv.hpp"

namespace kvstream::codec::test_codec {
namespace {

using namespace test;  // codec_cases.hpp
using test_util::k_is_rotated;

// ---- Helpers -------------------------------------------------------------------------

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

// ---- 4. Non-finite input ---------------------------------------------------------------

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

}  // namespace
}  // namespace kvstream::codec::test_codec

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

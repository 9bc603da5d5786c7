// Tests of progressive streams (one embedded stream per chunk; docs/bitstream.md,
// "Progressive streams"): every level is a prefix of the finest; a prefix decodes on
// its own; refining KV decoded from a prefix with the bytes that follow it gives, bit
// for bit, the longer prefix's decode; the prefix table and its distortions; and
// truncated, corrupt or mismatched prefixes fail cleanly without touching the output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kvstream/codec.hpp"
#include "kvstream/kv_model.hpp"
#include "kvstream/log.hpp"
#include "tests/codec/synthetic_kv.hpp"

namespace kvstream::codec {
namespace {

struct Case {
  const char* name;
  KvGeometry geom;
  RopeParams rope;
  bool code_k_before_rope = true;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"mha", {2, 4, 16, 4, AttentionKind::mha}, {}},
      {"gqa_rope_interleaved", {2, 2, 32, 8, AttentionKind::gqa}, {true, 10000.0f, 0, RopePairing::interleaved}},
      {"gqa_rope_half_partial", {2, 2, 32, 4, AttentionKind::gqa}, {true, 500000.0f, 16, RopePairing::half}},
      {"gqa_rope_coded_after", {1, 2, 16, 4, AttentionKind::gqa}, {true, 10000.0f, 0, RopePairing::half}, false},
      {"mla", {2, 1, 64, 16, AttentionKind::mla}, {}},
      // Enough channels x tokens per plane that refinement layers come in several groups.
      {"many_groups", {4, 2, 32, 4, AttentionKind::gqa}, {true, 10000.0f, 0, RopePairing::interleaved}},
  };
  return c;
}

KvCache make_cache(const KvGeometry& g, DType dt, uint64_t tokens, uint64_t first, const RopeParams& rope,
                   uint64_t seed) {
  KvCache c = KvCache::create(g, dt, tokens, first).value();
  c.set_rope(rope);
  test_util::fill_synthetic(c, rope, seed);
  return c;
}

const Profile& profile_for(const Case& cs) {
  static std::map<std::string, Profile> built;
  if (auto it = built.find(cs.name); it != built.end()) return it->second;
  set_log_level(LogLevel::warn);
  const KvCache a = make_cache(cs.geom, DType::f32, 96, 0, cs.rope, 11);
  const KvCache b = make_cache(cs.geom, DType::f32, 64, 300, cs.rope, 12);
  const std::vector<KvView> views = {a.view(), b.view()};
  ProfileOptions opt;
  opt.progressive = true;
  opt.progressive_layers = 5;
  opt.code_k_before_rope = cs.code_k_before_rope;
  opt.max_tables_per_level = 16;
  auto p = ProfileBuilder::build(views, cs.rope, opt);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return built.emplace(cs.name, std::move(p).value()).first->second;
}

std::vector<uint8_t> encode(const Profile& p, const KvView& v, uint32_t level) {
  std::vector<uint8_t> out;
  const Status st = encode_chunk(p, v, level, out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

bool same_bytes(const KvCache& a, const KvCache& b) {
  return a.bytes().size() == b.bytes().size() && std::memcmp(a.bytes().data(), b.bytes().data(), a.bytes().size()) == 0;
}

KvCache decode(const Profile& p, std::span<const uint8_t> bytes, const KvGeometry& g, DType dt, uint64_t tokens,
               uint64_t first) {
  KvCache out = KvCache::create(g, dt, tokens, first).value();
  const Status st = decode_chunk(p, bytes, out.view());
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

double mean_sq_error(const KvCache& a, const KvCache& b) {
  const KvGeometry& g = a.geometry();
  double s = 0, n = 0;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p)
      for (uint64_t t = 0; t < a.tokens(); ++t)
        for (uint32_t c = 0; c < g.channels(); ++c) {
          const double d = double(a.at(l, p, t, c)) - b.at(l, p, t, c);
          s += d * d, n += 1;
        }
  return s / n;
}

class Progressive : public ::testing::TestWithParam<std::string> {
 protected:
  const Case& cs() const {
    for (const Case& c : cases())
      if (GetParam() == c.name) return c;
    std::abort();
  }
};

TEST_P(Progressive, ProfileIsProgressiveWithoutAnchorsAndSurvivesSerialization) {
  const Profile& p = profile_for(cs());
  EXPECT_TRUE(p.progressive());
  EXPECT_EQ(p.levels(), 5u);
  EXPECT_EQ(p.predictor_counts()[uint32_t(Predictor::anchor)], 0u);
  for (uint32_t i = 0; i + 1 < p.levels(); ++i) {
    EXPECT_FLOAT_EQ(p.level(i).step * 3.0f, p.level(i + 1).step);
    EXPECT_GT(p.level(i).bits_per_element, p.level(i + 1).bits_per_element) << "level " << i;
    EXPECT_LT(p.level(i).distortion, p.level(i + 1).distortion) << "level " << i;
  }
  EXPECT_GE(p.level(0).distortion, 0.0);
  auto back = Profile::load(p.serialize());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(back->progressive());
  EXPECT_EQ(back->hash(), p.hash());
  for (uint32_t i = 0; i < p.levels(); ++i) EXPECT_EQ(back->level(i).distortion, p.level(i).distortion);
  // Every byte of a progressive profile is checked: a cut anywhere fails to load.
  const std::vector<uint8_t> bytes = p.serialize();
  for (size_t n = bytes.size() - 40; n < bytes.size(); ++n)
    EXPECT_FALSE(Profile::load(std::span(bytes).first(n)).ok()) << n;
}

// Level L's stream is a prefix of level 0's, its decode is what decoding the prefix
// gives, and finer levels reconstruct closer to the source.
TEST_P(Progressive, EveryLevelIsAPrefixAndDecodesCloser) {
  const Profile& p = profile_for(cs());
  const KvGeometry& g = cs().geom;
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (uint32_t tokens : {1u, 7u, 23u, 130u}) {
      const KvCache src = make_cache(g, dt, tokens, 40, cs().rope, tokens * 3 + uint32_t(dt));
      const std::vector<uint8_t> full = encode(p, src.view(), 0);
      double last_error = INFINITY;
      for (uint32_t L = p.levels(); L-- > 0;) {
        const std::vector<uint8_t> lv = encode(p, src.view(), L);
        ASSERT_LE(lv.size(), full.size());
        ASSERT_TRUE(std::equal(lv.begin(), lv.end(), full.begin())) << "level " << L << " is not a prefix";
        auto info = inspect_chunk(lv);
        ASSERT_TRUE(info.ok()) << info.status().to_string();
        EXPECT_TRUE(info->progressive);
        EXPECT_EQ(info->level, L);
        EXPECT_EQ(info->stream_bytes, full.size());
        EXPECT_EQ(info->coded_layers, p.levels());
        const KvCache out = decode(p, lv, g, DType::f32, tokens, 40);
        const double err = mean_sq_error(src, out);
        EXPECT_LE(err, last_error * 1.0001 + 1e-12) << "level " << L << ", " << tokens << " tokens";
        last_error = err;
      }
      // The finest of five layers at a base step of 4.2 is near lossless.
      const KvCache out = decode(p, full, g, DType::f32, tokens, 40);
      EXPECT_LT(mean_sq_error(src, out), 1e-3) << tokens << " tokens";
    }
}

// Refinement from any prefix to any longer one equals the longer prefix's decode, bit
// for bit, into any dtype and a strided output.
TEST_P(Progressive, RefinementEqualsDecodingTheLongerPrefix) {
  const Profile& p = profile_for(cs());
  const KvGeometry& g = cs().geom;
  const uint32_t tokens = cs().geom.layers == 4 ? 600 : 37;
  const KvCache src = make_cache(g, DType::f16, tokens, 1000, cs().rope, 5);
  const std::vector<uint8_t> full = encode(p, src.view(), 0);
  auto prefixes = chunk_prefixes(full);
  ASSERT_TRUE(prefixes.ok()) << prefixes.status().to_string();
  ASSERT_FALSE(prefixes->empty());
  EXPECT_EQ(prefixes->back().end, full.size());
  if (std::string(cs().name) == "many_groups") EXPECT_GT(prefixes->size(), size_t(p.levels()));  // inside layers too
  for (size_t i = 1; i < prefixes->size(); ++i) {
    EXPECT_GT((*prefixes)[i].end, (*prefixes)[i - 1].end);
    EXPECT_LE((*prefixes)[i].distortion, (*prefixes)[i - 1].distortion * 1.0001 + 1e-12);
  }
  const std::span<const uint8_t> all(full);
  for (size_t a = 0; a < prefixes->size(); ++a)
    for (size_t b = a + 1; b < prefixes->size(); ++b) {
      const uint64_t ea = (*prefixes)[a].end, eb = (*prefixes)[b].end;
      for (DType dt : {DType::f32, DType::bf16}) {
        const KvCache want = decode(p, all.first(eb), g, dt, tokens, 1000);
        KvCache got = decode(p, all.first(ea), g, dt, tokens, 1000);
        const Status st = refine_chunk(p, all.first(ea), all.subspan(ea, eb - ea), got.view());
        ASSERT_TRUE(st.ok()) << st.to_string();
        EXPECT_TRUE(same_bytes(want, got)) << "refining prefix " << a << " to " << b;
      }
    }
}

TEST_P(Progressive, ParallelDecodeMatchesSerial) {
  const Profile& p = profile_for(cs());
  const KvGeometry& g = cs().geom;
  const KvCache src = make_cache(g, DType::bf16, 600, 3, cs().rope, 8);
  const std::vector<uint8_t> full = encode(p, src.view(), 0);
  const KvCache serial = decode(p, full, g, DType::f32, 600, 3);
  for (unsigned threads : {2u, 3u}) {
    KvCache par = KvCache::create(g, DType::f32, 600, 3).value();
    ASSERT_TRUE(decode_chunk_parallel(p, full, par.view(), threads).ok());
    EXPECT_TRUE(same_bytes(serial, par)) << threads << " threads";
  }
}

std::string case_name(const ::testing::TestParamInfo<std::string>& i) { return i.param; }
std::vector<std::string> case_names() {
  std::vector<std::string> n;
  for (const Case& c : cases()) n.push_back(c.name);
  return n;
}
INSTANTIATE_TEST_SUITE_P(Geometries, Progressive, ::testing::ValuesIn(case_names()), case_name);

// ---- bad input ------------------------------------------------------------------------

struct Chunk {
  const Profile* p;
  KvCache src;
  std::vector<uint8_t> full;
  std::vector<ChunkPrefix> prefixes;
};
Chunk many_group_chunk() {
  const Case& cs = cases().back();
  const Profile& p = profile_for(cs);
  Chunk c{&p, make_cache(cs.geom, DType::f16, 600, 9, cs.rope, 77), {}, {}};
  c.full = encode(p, c.src.view(), 0);
  c.prefixes = chunk_prefixes(c.full).value();
  return c;
}

Status decode_untouched(const Profile& p, std::span<const uint8_t> bytes, const KvGeometry& g, uint64_t tokens,
                        bool* touched) {
  KvCache out = KvCache::create(g, DType::f32, tokens).value();
  std::memset(out.bytes().data(), 0x7b, out.bytes().size());
  const Status st = decode_chunk(p, bytes, out.view());
  *touched = false;
  for (std::byte x : out.bytes()) *touched |= x != std::byte{0x7b};
  return st;
}

// Cut anywhere: a prefix boundary decodes, anything else is corrupt_data and the
// output stays untouched.
TEST(ProgressiveCorrupt, TruncationOffPrefixBoundariesFails) {
  const Chunk c = many_group_chunk();
  const KvGeometry& g = c.src.geometry();
  std::vector<bool> boundary(c.full.size() + 1, false);
  for (const ChunkPrefix& pf : c.prefixes) boundary[pf.end] = true;
  const size_t step = std::max<size_t>(1, c.full.size() / 3000);
  for (size_t n = 0; n <= c.full.size(); n += (boundary[n] || n < 400) ? 1 : step) {
    bool touched = false;
    const Status st = decode_untouched(*c.p, std::span(c.full).first(n), g, 600, &touched);
    if (boundary[n]) {
      EXPECT_TRUE(st.ok()) << n << ": " << st.to_string();
    } else {
      ASSERT_FALSE(st.ok()) << "prefix of " << n << " bytes decoded";
      EXPECT_EQ(st.code(), StatusCode::corrupt_data) << n << ": " << st.to_string();
      EXPECT_FALSE(touched) << n;
    }
  }
}

TEST(ProgressiveCorrupt, FlippedBitsAnywhereAreCaughtBeforeTheOutput) {
  const Chunk c = many_group_chunk();
  const KvGeometry& g = c.src.geometry();
  for (size_t i = 0; i < c.full.size(); i += (i < 300 ? 1 : 97)) {
    std::vector<uint8_t> bad = c.full;
    bad[i] ^= uint8_t(1u << (i % 8));
    bool touched = false;
    const Status st = decode_untouched(*c.p, bad, g, 600, &touched);
    ASSERT_FALSE(st.ok()) << "flip at byte " << i << " decoded";
    EXPECT_FALSE(touched) << i;
  }
}

TEST(ProgressiveCorrupt, RefinementNeedsAKeptPrefixAndTheRightProfile) {
  const Chunk c = many_group_chunk();
  const KvGeometry& g = c.src.geometry();
  KvCache out = KvCache::create(g, DType::f32, 600, 9).value();
  const std::span<const uint8_t> all(c.full);
  const uint64_t e0 = c.prefixes[0].end;
  // Kept bytes that end inside a substream.
  Status st = refine_chunk(*c.p, all.first(e0 + 3), all.subspan(e0 + 3), out.view());
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st.to_string();
  // A single-level stream cannot be refined.
  ProfileOptions single;
  const std::vector<KvView> views = {c.src.view()};
  const Profile flat = ProfileBuilder::build(views, cases().back().rope, single).value();
  EXPECT_FALSE(flat.progressive());
  std::vector<uint8_t> one;
  ASSERT_TRUE(encode_chunk(flat, c.src.view(), 2, one).ok());
  st = refine_chunk(flat, one, {}, out.view());
  EXPECT_EQ(st.code(), StatusCode::invalid_argument);
  // Another profile's stream, either way.
  st = decode_chunk(flat, c.full, out.view());
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st.to_string();
  st = decode_chunk(*c.p, one, out.view());
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st.to_string();
  // The wrong token count.
  KvCache short_out = KvCache::create(g, DType::f32, 599, 9).value();
  EXPECT_EQ(decode_chunk(*c.p, c.full, short_out.view()).code(), StatusCode::invalid_argument);
}

TEST(ProgressiveHeader, PrefixTableReadsFromTheHeaderAlone) {
  const Chunk c = many_group_chunk();
  auto hb = chunk_header_bytes(std::span(c.full).first(64));
  ASSERT_TRUE(hb.ok()) << hb.status().to_string();
  ASSERT_LT(*hb, c.prefixes[0].end);
  auto from_header = chunk_prefixes(std::span(c.full).first(*hb));
  ASSERT_TRUE(from_header.ok()) << from_header.status().to_string();
  EXPECT_EQ(*from_header, c.prefixes);
  EXPECT_FALSE(chunk_prefixes(std::span(c.full).first(*hb - 1)).ok());
  // Levels: each whole layer once, finest last.
  std::vector<uint32_t> levels;
  for (const ChunkPrefix& pf : c.prefixes)
    if (pf.whole_layer) levels.push_back(pf.level);
  EXPECT_EQ(levels, (std::vector<uint32_t>{4, 3, 2, 1, 0}));
}

TEST(ProgressiveProfile, BuilderRejectsBadLayerOptions) {
  const Case& cs = cases()[0];
  const KvCache a = make_cache(cs.geom, DType::f32, 32, 0, cs.rope, 1);
  const std::vector<KvView> views = {a.view()};
  for (uint32_t layers : {0u, kMaxProgressiveLayers + 1}) {
    ProfileOptions opt;
    opt.progressive = true;
    opt.progressive_layers = layers;
    EXPECT_EQ(ProfileBuilder::build(views, cs.rope, opt).status().code(), StatusCode::invalid_argument) << layers;
  }
  for (float step : {0.0f, -1.0f, NAN}) {
    ProfileOptions opt;
    opt.progressive = true;
    opt.progressive_base_step = step;
    EXPECT_EQ(ProfileBuilder::build(views, cs.rope, opt).status().code(), StatusCode::invalid_argument) << step;
  }
  // A single-level profile keeps version 1's bytes (its hash is what its streams carry).
  const Profile flat = ProfileBuilder::build(views, cs.rope, ProfileOptions{}).value();
  const std::vector<uint8_t> bytes = flat.serialize();
  uint32_t version;
  std::memcpy(&version, bytes.data() + 4, 4);
  EXPECT_EQ(version, 1u);
}

}  // namespace
}  // namespace kvstream::codec

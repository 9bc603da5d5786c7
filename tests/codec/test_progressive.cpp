// Tests of progressive streams (one embedded stream per chunk; docs/bitstream.md,
// "Progressive streams"): every level is a prefix of the finest; a prefix decodes on
// its own; refining KV decoded from a prefix with the bytes that follow it gives, bit
// for bit, the longer prefix's decode; recent rows carried in the base, or leading in
// every layer (checked plane by plane against the stream order, which reads the
// format's grouping from codec/layered_format.hpp); the prefix table and its
// distortions; and truncated, corrupt or mismatched prefixes fail cleanly without
// touching the output.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "codec/layered_format.hpp"
#include "kvstream/codec.hpp"
#include "kvstream/kv_model.hpp"
#include "kvstream/log.hpp"
#include "tests/codec/decode_untouched.hpp"
#include "tests/codec/synthetic_kv.hpp"

namespace kvstream::codec::test_progressive {
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

using test_util::synthetic_cache;
using test::decode_untouched;

// `recent`: the profile codes a context's last 16 tokens with 2 layers in the base;
// `lead`: and keeps them 2 layers ahead in every refinement layer.
const Profile& profile_for(const Case& cs, bool recent = false, bool lead = false) {
  static std::map<std::string, Profile> built;
  const std::string key = std::string(cs.name) + (recent ? "/recent" : "") + (lead ? "/lead" : "");
  if (auto it = built.find(key); it != built.end()) return it->second;
  set_log_level(LogLevel::warn);
  const KvCache a = synthetic_cache(cs.geom, DType::f32, 96, 0, cs.rope, 11);
  const KvCache b = synthetic_cache(cs.geom, DType::f32, 64, 300, cs.rope, 12);
  const std::vector<KvView> views = {a.view(), b.view()};
  ProfileOptions opt;
  opt.progressive = true;
  opt.progressive_layers = 5;
  opt.code_k_before_rope = cs.code_k_before_rope;
  opt.max_tables_per_level = 16;
  opt.recent_tokens = recent ? 16 : 0;
  opt.recent_layers = 2;
  opt.recent_lead = lead;
  auto p = ProfileBuilder::build(views, cs.rope, opt);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return built.emplace(key, std::move(p).value()).first->second;
}

std::vector<uint8_t> encode(const Profile& p, const KvView& v, uint32_t level, uint32_t recent = 0) {
  std::vector<uint8_t> out;
  const Status st = encode_chunk(p, v, level, EncodeOptions{recent}, out);
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
      const KvCache src = synthetic_cache(g, dt, tokens, 40, cs().rope, tokens * 3 + uint32_t(dt));
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
  const KvCache src = synthetic_cache(g, DType::f16, tokens, 1000, cs().rope, 5);
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
  const KvCache src = synthetic_cache(g, DType::bf16, 600, 3, cs().rope, 8);
  const std::vector<uint8_t> full = encode(p, src.view(), 0);
  const KvCache serial = decode(p, full, g, DType::f32, 600, 3);
  for (unsigned threads : {2u, 3u}) {
    KvCache par = KvCache::create(g, DType::f32, 600, 3).value();
    ASSERT_TRUE(decode_chunk_parallel(p, full, par.view(), threads).ok());
    EXPECT_TRUE(same_bytes(serial, par)) << threads << " threads";
  }
}

// Rows [first, end) of two caches hold the same values, bit for bit.
bool same_plane_rows(const KvCache& a, const KvCache& b, uint32_t lp, uint64_t first, uint64_t end) {
  const KvGeometry& g = a.geometry();
  const uint32_t l = lp / g.planes(), p = lp % g.planes();
  for (uint64_t t = first; t < end; ++t)
    for (uint32_t c = 0; c < g.channels(); ++c)
      if (std::bit_cast<uint32_t>(a.at(l, p, t, c)) != std::bit_cast<uint32_t>(b.at(l, p, t, c))) return false;
  return true;
}

bool same_rows(const KvCache& a, const KvCache& b, uint64_t first, uint64_t end) {
  const KvGeometry& g = a.geometry();
  for (uint32_t lp = 0; lp < g.layers * g.planes(); ++lp)
    if (!same_plane_rows(a, b, lp, first, end)) return false;
  return true;
}

// A chunk's recent rows carry the profile's recent layers in the base: at every level
// they decode as that many layers finer would (bit for bit), the other rows as the
// level does without recent rows.
TEST_P(Progressive, RecentRowsDecodeLayersFinerAndTheOthersAsBefore) {
  const Profile& p = profile_for(cs(), true);
  ASSERT_EQ(p.recent_tokens(), 16u);
  ASSERT_EQ(p.recent_layers(), 2u);
  const KvGeometry& g = cs().geom;
  const uint32_t n = p.levels(), J = p.recent_layers();
  for (uint32_t tokens : {1u, 16u, 41u, 130u})
    for (uint32_t recent : {1u, 5u, 16u}) {
      if (recent > tokens) continue;
      const KvCache src = synthetic_cache(g, DType::f16, tokens, 20, cs().rope, tokens * 7 + recent);
      const std::vector<uint8_t> full = encode(p, src.view(), 0, recent);
      const std::vector<uint8_t> plain = encode(p, src.view(), 0);
      for (uint32_t L = n; L-- > 0;) {
        const std::vector<uint8_t> lv = encode(p, src.view(), L, recent);
        ASSERT_TRUE(std::equal(lv.begin(), lv.end(), full.begin())) << "level " << L << " is not a prefix";
        const KvCache got = decode(p, lv, g, DType::f32, tokens, 20);
        const KvCache others = decode(p, encode(p, src.view(), L), g, DType::f32, tokens, 20);
        const KvCache recents = decode(p, encode(p, src.view(), std::min(L, n - 1 - J)), g, DType::f32, tokens, 20);
        EXPECT_TRUE(same_rows(got, others, 0, tokens - recent)) << tokens << " tokens, " << recent << " recent, level " << L;
        EXPECT_TRUE(same_rows(got, recents, tokens - recent, tokens))
            << tokens << " tokens, " << recent << " recent, level " << L;
      }
      // The recent rows' layers move into the base: a longer base, nearer the source.
      const std::vector<ChunkPrefix> with = chunk_prefixes(full).value(), without = chunk_prefixes(plain).value();
      ASSERT_EQ(with.size(), without.size());
      EXPECT_GT(with[0].end, without[0].end);
      EXPECT_LE(with[0].distortion, without[0].distortion);
      EXPECT_EQ(with.back().distortion, without.back().distortion);
    }
}

// With recent rows that lead, each refinement layer's lead substreams refine them
// ahead of the others: at every prefix the other rows decode as the plain stream's
// prefix at the same layer does, the recent rows as J layers finer (at most the
// finest), bit for bit; the base is the base of a profile whose recent rows do not lead.
TEST_P(Progressive, RecentRowsThatLeadStayAheadAtEveryPrefix) {
  const Profile& p = profile_for(cs(), true, true);
  const Profile& base_only = profile_for(cs(), true);
  ASSERT_TRUE(p.recent_lead());
  ASSERT_FALSE(base_only.recent_lead());
  const KvGeometry& g = cs().geom;
  const uint32_t n = p.levels(), J = p.recent_layers();
  for (uint32_t tokens : {1u, 41u, 130u})
    for (uint32_t recent : {1u, 16u}) {
      if (recent > tokens) continue;
      const KvCache src = synthetic_cache(g, DType::f16, tokens, 20, cs().rope, tokens * 5 + recent);
      const std::vector<uint8_t> full = encode(p, src.view(), 0, recent);
      const std::span<const uint8_t> all(full);
      const std::vector<ChunkPrefix> prefixes = chunk_prefixes(full).value();
      std::vector<KvCache> plain;  // the stream without recent rows, decoded at each layer
      for (uint32_t k = 0; k < n; ++k)
        plain.push_back(decode(p, encode(p, src.view(), n - 1 - k), g, DType::f32, tokens, 20));
      const std::vector<ChunkPrefix> base_only_prefixes =
          chunk_prefixes(encode(base_only, src.view(), 0, recent)).value();
      for (size_t i = 0; i < prefixes.size(); ++i) {
        const ChunkPrefix& pf = prefixes[i];
        // Whole layer k: others at k, recent at min(k + J, n - 1). Inside layer k (its
        // lead substreams only): others at k - 1, recent at min(k + J, n - 1).
        const uint32_t k = pf.whole_layer ? n - 1 - pf.level : n - pf.level;
        const uint32_t others = pf.whole_layer ? k : k - 1, ahead = std::min(k + J, n - 1);
        const KvCache got = decode(p, all.first(pf.end), g, DType::f32, tokens, 20);
        EXPECT_TRUE(same_rows(got, plain[others], 0, tokens - recent)) << tokens << " tokens, prefix " << i;
        EXPECT_TRUE(same_rows(got, plain[ahead], tokens - recent, tokens)) << tokens << " tokens, prefix " << i;
        if (i > 0) EXPECT_LE(pf.distortion, prefixes[i - 1].distortion);
      }
      // The base holds what a base-only window's base holds.
      const KvCache base = decode(p, all.first(prefixes[0].end), g, DType::f32, tokens, 20);
      const std::vector<uint8_t> other = encode(base_only, src.view(), n - 1, recent);
      EXPECT_TRUE(same_bytes(base, decode(base_only, other, g, DType::f32, tokens, 20))) << tokens << " tokens";
      // One lead substream per group in each of the n - 1 - J lower refinement layers.
      const size_t groups = (base_only_prefixes.size() - 1) / (n - 1);
      EXPECT_EQ(prefixes.size(), 1 + groups * (2 * (n - 1) - J)) << tokens << " tokens";
      // Those are the prefixes that refine the recent rows only; a stream whose recent
      // rows do not lead has none.
      auto recent_only = [](const std::vector<ChunkPrefix>& ps) {
        return std::count_if(ps.begin(), ps.end(), [](const ChunkPrefix& pf) { return pf.recent_only; });
      };
      EXPECT_EQ(size_t(recent_only(prefixes)), groups * (n - 1 - J)) << tokens << " tokens";
      EXPECT_EQ(recent_only(base_only_prefixes), 0);
    }
}

// Several plane groups per layer: walking the stream one substream at a time, every
// prefix leaves each group's rows where the stream order puts them (per refinement
// layer k its lead substreams, each moving one group's recent rows to layer k + J,
// then its groups, each moving one group's other rows to layer k), plane by plane, bit
// for bit against the plain stream decoded at that layer.
TEST(ProgressiveLead, SeveralGroupsFollowTheStreamOrderPlaneByPlane) {
  const Case& cs = cases().back();
  ASSERT_STREQ(cs.name, "many_groups");
  const Profile& p = profile_for(cs, true, true);
  const KvGeometry& g = cs.geom;
  const uint32_t n = p.levels(), J = p.recent_layers(), T = 600, R = 16;
  const LayeredGrouping G = layered_grouping(g, T);
  ASSERT_GT(G.groups, 2u);
  const KvCache src = synthetic_cache(g, DType::f16, T, 0, cs.rope, 31);
  const std::vector<uint8_t> full = encode(p, src.view(), 0, R);
  const std::vector<ChunkPrefix> prefixes = chunk_prefixes(full).value();
  std::vector<KvCache> plain;  // the stream without recent rows, decoded at each layer
  for (uint32_t k = 0; k < n; ++k) plain.push_back(decode(p, encode(p, src.view(), n - 1 - k), g, DType::f32, T, 0));
  std::vector<std::pair<bool, uint32_t>> order;  // (lead substream, group) after the base
  for (uint32_t k = 1; k < n; ++k) {
    if (k + J <= n - 1)
      for (uint32_t gi = 0; gi < G.groups; ++gi) order.push_back({true, gi});
    for (uint32_t gi = 0; gi < G.groups; ++gi) order.push_back({false, gi});
  }
  ASSERT_EQ(prefixes.size(), order.size() + 1);
  std::vector<uint32_t> others(G.groups, 0), recent(G.groups, J);
  for (size_t i = 0; i < prefixes.size(); ++i) {
    if (i > 0) ++(order[i - 1].first ? recent : others)[order[i - 1].second];
    EXPECT_EQ(prefixes[i].recent_only, i > 0 && order[i - 1].first) << "prefix " << i;
    const KvCache got = decode(p, std::span(full).first(prefixes[i].end), g, DType::f32, T, 0);
    for (uint32_t gi = 0; gi < G.groups; ++gi)
      for (uint32_t lp = G.first_plane(gi); lp < G.end_plane(gi); ++lp) {
        EXPECT_TRUE(same_plane_rows(got, plain[others[gi]], lp, 0, T - R)) << "prefix " << i << " plane " << lp;
        EXPECT_TRUE(same_plane_rows(got, plain[recent[gi]], lp, T - R, T)) << "prefix " << i << " plane " << lp;
      }
  }
}

TEST_P(Progressive, RefinementWithRecentRowsEqualsDecodingTheLongerPrefix) {
  for (const bool lead : {false, true}) {
  const Profile& p = profile_for(cs(), true, lead);
  const KvGeometry& g = cs().geom;
  const uint32_t tokens = cs().geom.layers == 4 ? 600 : 37;
  for (uint32_t recent : {3u, tokens}) {
    const KvCache src = synthetic_cache(g, DType::f16, tokens, 1000, cs().rope, 6);
    const std::vector<uint8_t> full = encode(p, src.view(), 0, std::min(recent, 16u));
    const std::vector<ChunkPrefix> prefixes = chunk_prefixes(full).value();
    const std::span<const uint8_t> all(full);
    for (size_t a = 0; a < prefixes.size(); ++a)
      for (size_t b = a + 1; b < prefixes.size(); ++b) {
        const uint64_t ea = prefixes[a].end, eb = prefixes[b].end;
        const KvCache want = decode(p, all.first(eb), g, DType::bf16, tokens, 1000);
        KvCache got = decode(p, all.first(ea), g, DType::bf16, tokens, 1000);
        const Status st = refine_chunk(p, all.first(ea), all.subspan(ea, eb - ea), got.view());
        ASSERT_TRUE(st.ok()) << st.to_string();
        EXPECT_TRUE(same_bytes(want, got)) << "refining prefix " << a << " to " << b << (lead ? " (lead)" : "");
      }
  }
  // The whole chunk recent: the recent layers' groups hold no rows and still decode.
  const KvCache small = synthetic_cache(g, DType::f32, 9, 0, cs().rope, 2);
  const std::vector<uint8_t> all_recent = encode(p, small.view(), 0, 9);
  for (const ChunkPrefix& pf : chunk_prefixes(all_recent).value())
    decode(p, std::span(all_recent).first(pf.end), g, DType::f32, 9, 0);
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
Chunk many_group_chunk(uint32_t recent = 0, bool lead = false) {
  const Case& cs = cases().back();
  const Profile& p = profile_for(cs, recent > 0, lead);
  Chunk c{&p, synthetic_cache(cs.geom, DType::f16, 600, 9, cs.rope, 77), {}, {}};
  c.full = encode(p, c.src.view(), 0, recent);
  c.prefixes = chunk_prefixes(c.full).value();
  return c;
}

// Cut anywhere: a prefix boundary decodes, anything else is corrupt_data and the
// output stays untouched.
TEST(ProgressiveCorrupt, TruncationOffPrefixBoundariesFails) {
  for (const auto& [recent, lead] : {std::pair{0u, false}, std::pair{16u, false}, std::pair{16u, true}}) {
  const Chunk c = many_group_chunk(recent, lead);
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
}

TEST(ProgressiveCorrupt, FlippedBitsAnywhereAreCaughtBeforeTheOutput) {
  for (const auto& [recent, lead] : {std::pair{0u, false}, std::pair{16u, false}, std::pair{16u, true}}) {
    const Chunk c = many_group_chunk(recent, lead);
    const KvGeometry& g = c.src.geometry();
    for (size_t i = 0; i < c.full.size(); i += (i < 300 ? 1 : 97)) {
      std::vector<uint8_t> bad = c.full;
      bad[i] ^= uint8_t(1u << (i % 8));
      bool touched = false;
      const Status st = decode_untouched(*c.p, bad, g, 600, &touched);
      ASSERT_FALSE(st.ok()) << "flip at byte " << i << " decoded (recent " << recent << ")";
      EXPECT_FALSE(touched) << i;
    }
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
  for (const auto& [recent, lead] : {std::pair{0u, false}, std::pair{16u, false}, std::pair{16u, true}}) {
  const Chunk c = many_group_chunk(recent, lead);
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
}

TEST(ProgressiveProfile, BuilderRejectsBadLayerOptions) {
  const Case& cs = cases()[0];
  const KvCache a = synthetic_cache(cs.geom, DType::f32, 32, 0, cs.rope, 1);
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


TEST(ProgressiveProfile, RecentWindowSurvivesSerializationAndIsChecked) {
  const Profile& p = profile_for(cases()[0], true);
  const std::vector<uint8_t> bytes = p.serialize();
  uint32_t version;
  std::memcpy(&version, bytes.data() + 4, 4);
  EXPECT_EQ(version, 3u);
  auto back = Profile::load(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->hash(), p.hash());
  EXPECT_EQ(back->recent_tokens(), 16u);
  EXPECT_EQ(back->recent_layers(), 2u);
  EXPECT_NE(p.hash(), profile_for(cases()[0]).hash());
  // A profile without a recent window keeps version 2.
  const std::vector<uint8_t> plain = profile_for(cases()[0]).serialize();
  std::memcpy(&version, plain.data() + 4, 4);
  EXPECT_EQ(version, 2u);
  EXPECT_EQ(profile_for(cases()[0]).recent_tokens(), 0u);
  // Recent rows that lead: version 4, a hash of its own.
  const std::vector<uint8_t> led = profile_for(cases()[0], true, true).serialize();
  std::memcpy(&version, led.data() + 4, 4);
  EXPECT_EQ(version, 4u);
  auto led_back = Profile::load(led);
  ASSERT_TRUE(led_back.ok()) << led_back.status().to_string();
  EXPECT_TRUE(led_back->recent_lead());
  EXPECT_EQ(led_back->recent_layers(), 2u);
  EXPECT_NE(led_back->hash(), p.hash());
  EXPECT_FALSE(back->recent_lead());

  const KvCache a = synthetic_cache(cases()[0].geom, DType::f32, 32, 0, cases()[0].rope, 1);
  const std::vector<KvView> views = {a.view()};
  for (uint32_t layers : {0u, 5u, 9u}) {
    ProfileOptions opt;
    opt.progressive = true, opt.progressive_layers = 5, opt.recent_tokens = 8, opt.recent_layers = layers;
    EXPECT_EQ(ProfileBuilder::build(views, cases()[0].rope, opt).status().code(), StatusCode::invalid_argument)
        << layers;
  }
  // More recent tokens than the chunk has.
  std::vector<uint8_t> out;
  EXPECT_EQ(encode_chunk(p, a.view(), 0, EncodeOptions{33}, out).code(), StatusCode::invalid_argument);
  EXPECT_TRUE(out.empty());
}

TEST(ProgressiveProfile, RecentTokensOfAChunkAreItsShareOfTheContextsLast) {
  const Profile& p = profile_for(cases()[0], true);  // the last 16 tokens
  EXPECT_EQ(recent_tokens_of(p, {0, 128}, 128), 16u);
  EXPECT_EQ(recent_tokens_of(p, {0, 128}, 256), 0u);
  EXPECT_EQ(recent_tokens_of(p, {128, 256}, 256), 16u);
  EXPECT_EQ(recent_tokens_of(p, {0, 250}, 260), 6u);    // the window spans two chunks
  EXPECT_EQ(recent_tokens_of(p, {250, 260}, 260), 10u);
  EXPECT_EQ(recent_tokens_of(p, {0, 10}, 10), 10u);     // a context shorter than the window
  EXPECT_EQ(recent_tokens_of(p, {0, 10}, 5), 0u);       // a chunk beyond its context: none
  EXPECT_EQ(recent_tokens_of(profile_for(cases()[0]), {0, 128}, 128), 0u);
}

}  // namespace
}  // namespace kvstream::codec::test_progressive

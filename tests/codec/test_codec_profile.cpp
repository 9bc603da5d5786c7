// Codec profiles (include/kvstream/codec.hpp): serialization to bytes and files and
// back with the same hash and the same decodes, rejection of every corrupted or
// truncated profile, the hash following level quality, the builder's rejection of bad
// options, and MLA never undoing RoPE. A profile is shared by encoder and decoder,
// often through a file, so a damaged or different one must be refused rather than
// decode chunks into wrong values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <unistd.h>
#include <vector>

#include "kvstream/codec.hpp"
#include "kvstream/kv_model.hpp"
#include "kvstream/log.hpp"
#include "tests/codec/codec_cases.hpp"
#include <xxhash.h>

namespace kvstream::codec::test_codec_profile {
namespace {

using namespace test;  // codec_cases.hpp

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

// The build runs its (layer, plane)s, levels and samples on parallel workers; the
// profile must not depend on how many, byte for byte (single-level with KLT planes and
// anchors, and progressive with a recent window).
TEST(CodecProfile, TheBuildIsTheSameForAnyNumberOfWorkers) {
  set_log_level(LogLevel::warn);
  const Case& cs = case_named("gqa_rope_half_partial");
  const KvCache a = make_cache(cs.geom, DType::f32, 48, 0, cs.rope, 5);
  const KvCache b = make_cache(cs.geom, DType::f32, 33, 200, cs.rope, 6);
  const KvView views[2] = {a.view(), b.view()};
  for (const bool progressive : {false, true}) {
    ProfileOptions opt;
    opt.level_steps = {0.1f, 0.4f, 1.0f, 2.0f};
    opt.progressive = progressive;
    opt.progressive_layers = 3;
    opt.recent_tokens = 8;
    opt.transform_min_gain = 0.0;  // KLT wherever it saves anything
    opt.max_tables_per_level = 4;
    std::vector<uint8_t> first;
    for (const unsigned threads : {1u, 2u, 5u}) {
      opt.threads = threads;
      auto p = ProfileBuilder::build(views, cs.rope, opt);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      if (first.empty()) {
        first = p->serialize();
        continue;
      }
      EXPECT_TRUE(p->serialize() == first) << (progressive ? "progressive" : "single-level") << ", " << threads
                                           << " workers";
    }
  }
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
}  // namespace kvstream::codec::test_codec_profile

// Rejection of corrupt and mismatched chunks by the public codec API: a chunk cut at
// any offset, any header bit flipped, a corrupted payload, a chunk of another profile,
// an output of another geometry or token count, and bad encode arguments. Chunks cross
// networks and stores, so a bad one must fail with a clear status and leave the output
// untouched, never crash or write garbage into a caller's KV cache.
//
// Only the public API is used, except in one test that re-seals a corrupted payload
// with the header writer of codec/bitstream.hpp so the decoder behind the checksum
// sees garbage (it must fail cleanly or succeed, never crash).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "codec/bitstream.hpp"
#include "kvstream/codec.hpp"
#include "kvstream/kv_model.hpp"
#include "tests/codec/codec_cases.hpp"
#include "tests/codec/decode_untouched.hpp"

namespace kvstream::codec::test_codec_corrupt {
namespace {

using namespace test;  // codec_cases.hpp, decode_untouched.hpp

// ---- Corrupt and mismatched input ------------------------------------------------

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

}  // namespace
}  // namespace kvstream::codec::test_codec_corrupt

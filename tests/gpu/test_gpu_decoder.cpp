// GPU chunk decoder (include/kvstream/gpu_decoder.hpp): bit-exact with the CPU
// decoder for every level, output type and geometry (identity planes, anchors, KLT
// planes, outliers and exact values, RoPE interleaved and half, odd token counts and
// channel counts). Without a usable GPU (or without CUDA in the build) only the
// "clear error" and the test-data coverage checks run; the comparisons skip with a
// message.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "codec/bitstream.hpp"
#include "codec/profile_impl.hpp"
#include "tests/codec/synthetic_kv.hpp"
#include "kvstream/codec.hpp"
#include "kvstream/gpu.hpp"
#include "kvstream/gpu_decoder.hpp"
#include "kvstream/kv_model.hpp"
#include "kvstream/log.hpp"
#include "codec/impl_access.hpp"

namespace kvstream::gpu::test_gpu_decoder {
namespace {

using codec::Profile;
using codec::ProfileOptions;

// ---- synthetic, structured KV data (as tests/codec/codec_cases.hpp) --------------------

using test_util::fill_synthetic;
using test_util::keyed_unit;
using test_util::k_is_rotated;
using test_util::splitmix;

using test_util::synthetic_cache;

// Random symbols rather than structure: i.i.d. values with a heavy tail, which gives
// many escapes and outliers.
KvCache make_random(const KvGeometry& g, uint64_t tokens, uint64_t first, uint64_t seed) {
  KvCache c = KvCache::create(g, DType::f32, tokens, first).value();
  std::mt19937_64 rng(seed);
  std::student_t_distribution<float> heavy(2.0f);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p)
      for (uint64_t t = 0; t < tokens; ++t)
        for (uint32_t ch = 0; ch < g.channels(); ++ch) c.set(l, p, t, ch, std::clamp(heavy(rng), -3e4f, 3e4f));
  return c;
}

struct Case {
  const char* name;
  KvGeometry geom;
  RopeParams rope;
  uint32_t group_size;
  bool allow_transform;
  double transform_min_gain;
  uint32_t max_block;
  bool code_k_before_rope = true;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      // identity planes with anchor/mean/none predictors, no RoPE
      {"mha_anchor", {2, 4, 16, 4, AttentionKind::mha}, {}, 10, false, 0.2, 128},
      // KLT everywhere (32-channel blocks), RoPE interleaved over the whole head
      {"gqa_klt_rope_interleaved", {2, 2, 32, 8, AttentionKind::gqa}, {true, 10000.0f, 0, RopePairing::interleaved},
       10, true, 0.0, 32},
      // builder's choice, RoPE half pairing on 16 of 32 dims, group 7
      {"gqa_rope_half_partial", {2, 2, 32, 4, AttentionKind::gqa}, {true, 500000.0f, 16, RopePairing::half}, 7, true,
       0.2, 128},
      // MLA latent in a KLT basis of 16-channel blocks (never rotated)
      {"mla_klt", {2, 1, 64, 16, AttentionKind::mla}, {}, 10, true, 0.0, 16},
      // 288 channels (more than a block's threads, not a multiple of 32), 96-dim heads
      {"wide_heads_rope_half", {1, 3, 96, 3, AttentionKind::mha}, {true, 10000.0f, 0, RopePairing::half}, 5, false,
       0.2, 128},
  };
  return c;
}

const Profile& profile_of(const Case& cs) {
  static std::map<std::string, Profile> built;
  auto it = built.find(cs.name);
  if (it != built.end()) return it->second;
  set_log_level(LogLevel::warn);
  std::vector<KvCache> samples;
  samples.push_back(synthetic_cache(cs.geom, DType::f32, 96, 0, cs.rope, 11));
  samples.push_back(synthetic_cache(cs.geom, DType::f32, 64, 300, cs.rope, 12));
  std::vector<KvView> views;
  for (const KvCache& s : samples) views.push_back(s.view());
  ProfileOptions opt;
  opt.group_size = cs.group_size;
  opt.code_k_before_rope = cs.code_k_before_rope;
  opt.allow_transform = cs.allow_transform;
  opt.transform_min_gain = cs.transform_min_gain;
  opt.max_transform_block = cs.max_block;
  opt.max_tables_per_level = 16;
  auto prof = codec::ProfileBuilder::build(views, cs.rope, opt);
  EXPECT_TRUE(prof.ok()) << cs.name << ": " << prof.status().to_string();
  return built.emplace(cs.name, std::move(prof).value()).first->second;
}

// The decoder for a profile, or null with the reason (no GPU / no CUDA).
std::unique_ptr<GpuDecoder> decoder_for(const Profile& p, std::string& why) {
  auto d = GpuDecoder::create(p);
  if (d.ok()) return std::move(d).value();
  why = d.status().to_string();
  return nullptr;
}

#define REQUIRE_GPU(dec, prof)                                                                  \
  std::string why_;                                                                             \
  std::unique_ptr<GpuDecoder> dec = decoder_for(prof, why_);                                    \
  if (!dec) GTEST_SKIP() << "no usable GPU, GPU/CPU comparison skipped: " << why_;

std::vector<uint8_t> encode(const Profile& p, const KvView& v, uint32_t level) {
  std::vector<uint8_t> out;
  const Status st = codec::encode_chunk(p, v, level, out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

// CPU and GPU decodes of `bytes` into `dt`, compared byte for byte.
void expect_same(GpuDecoder& gpu, const Profile& p, const std::vector<uint8_t>& bytes, DType dt, uint64_t tokens,
                 uint64_t first, const std::string& what) {
  const KvGeometry& g = p.geometry();
  KvCache cpu = KvCache::create(g, dt, tokens, first).value();
  KvCache dev = KvCache::create(g, dt, tokens, first).value();
  // Different fill so that an element the GPU forgot to write cannot match by chance.
  std::memset(dev.bytes().data(), 0xA5, dev.bytes().size());
  ASSERT_TRUE(codec::decode_chunk(p, bytes, cpu.view()).ok()) << what;
  const Status st = gpu.decode_to_host(bytes, dev.view());
  ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
  const auto a = cpu.bytes(), b = dev.bytes();
  ASSERT_EQ(a.size(), b.size());
  if (std::memcmp(a.data(), b.data(), a.size()) == 0) return;
  const uint32_t C = g.channels();
  size_t bad = 0;
  std::string first_bad;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t pl = 0; pl < g.planes(); ++pl)
      for (uint64_t t = 0; t < tokens; ++t)
        for (uint32_t c = 0; c < C; ++c) {
          const float x = cpu.at(l, pl, t, c), y = dev.at(l, pl, t, c);
          if (std::memcmp(&x, &y, 4) != 0 && ++bad == 1)
            first_bad = fmt::format("layer {} plane {} token {} channel {}: cpu {:.9g} gpu {:.9g}", l, pl, t, c, x, y);
        }
  ADD_FAILURE() << what << ": " << bad << " elements differ; first at " << first_bad;
}

class GpuCase : public ::testing::TestWithParam<std::string> {
 protected:
  const Case& cs() const {
    for (const Case& c : cases())
      if (GetParam() == c.name) return c;
    std::abort();
  }
};

// ---- tests -----------------------------------------------------------------------------

TEST(GpuDecoder, WithoutAGpuCreateIsAClearError) {
  const Profile& p = profile_of(cases()[0]);
  auto d = GpuDecoder::create(p);
  if (d.ok()) {
    EXPECT_EQ((*d)->device(), 0);
    EXPECT_TRUE(built_with_cuda());
    GTEST_SKIP() << "a GPU is present: " << probe_device()->name;
  }
  const Status st = d.status();
  if (!built_with_cuda()) {
    EXPECT_EQ(st.code(), StatusCode::unsupported) << st.to_string();
  } else {
    EXPECT_EQ(st.code(), StatusCode::unavailable) << st.to_string();
    EXPECT_NE(st.message().find("GPU"), std::string::npos) << st.to_string();
  }
  EXPECT_FALSE(st.message().empty());
  // Same answer again (the probe is cached), and no crash on a bad device index.
  EXPECT_EQ(GpuDecoder::create(p).status().code(), st.code());
  EXPECT_FALSE(GpuDecoder::create(p, 7).ok());
}

TEST(GpuDecoder, OutputBytes) {
  EXPECT_EQ(GpuDecoder::output_bytes({2, 4, 16, 4, AttentionKind::mha}, 10, DType::f16), 2u * 2 * 10 * 64 * 2);
  EXPECT_EQ(GpuDecoder::output_bytes({3, 1, 64, 16, AttentionKind::mla}, 5, DType::f32), 3u * 1 * 5 * 64 * 4);
}

// The comparisons are only worth something if the data exercises every path.
TEST(GpuDecoder, TestDataCoversEveryPath) {
  bool klt = false, anchor = false, identity = false, rope_il = false, rope_half = false;
  for (const Case& cs : cases()) {
    const auto& p = codec::ProfileAccess::of(profile_of(cs));
    for (uint32_t l = 0; l < p.geom.layers; ++l)
      for (uint32_t pl = 0; pl < p.geom.planes(); ++pl) {
        const uint32_t b = p.block_of(size_t(l) * p.geom.planes() + pl);
        klt |= b != 0;
        identity |= b == 0;
        anchor |= b == 0 && p.has_anchor(l, pl);
      }
    if (codec::unrotates(p, 0)) (p.rope.pairing == RopePairing::half ? rope_half : rope_il) = true;
  }
  EXPECT_TRUE(klt);
  EXPECT_TRUE(anchor);
  EXPECT_TRUE(identity);
  EXPECT_TRUE(rope_il);
  EXPECT_TRUE(rope_half);
}

TEST_P(GpuCase, BitExactEveryLevelDtypeAndTokenCount) {
  const Profile& p = profile_of(cs());
  REQUIRE_GPU(gpu, p);
  const KvGeometry& g = cs().geom;
  for (uint64_t tokens : {1u, 7u, 45u, 100u}) {
    const uint64_t first = 3 * tokens + 17;
    const KvCache src = synthetic_cache(g, DType::f16, tokens, first, cs().rope, 1000 + tokens);
    for (uint32_t level = 0; level < p.levels(); ++level) {
      const std::vector<uint8_t> bytes = encode(p, src.view(), level);
      for (DType dt : {DType::f32, DType::f16, DType::bf16})
        expect_same(*gpu, p, bytes, dt, tokens, first,
                    fmt::format("{} tokens level {} {}", tokens, level, dtype_name(dt)));
    }
  }
}

TEST_P(GpuCase, BitExactWithOutliersAndExactValues) {
  const Profile& p = profile_of(cs());
  REQUIRE_GPU(gpu, p);
  const KvGeometry& g = cs().geom;
  const uint32_t C = g.channels(), P = g.planes();
  KvCache src = synthetic_cache(g, DType::f32, 53, 9, cs().rope, 33);
  src.set(0, P - 1, 0, 3, 1e4f);             // in an anchor row
  src.set(0, P - 1, 13, C - 1, -1e4f);
  src.set(g.layers - 1, 0, 20, C / 2, 1e4f);
  src.set(g.layers - 1, P - 1, 52, 0, 12345.678f);
  for (uint64_t t = 30; t < 33; ++t) src.set(0, 0, t, 1, -777.0f);  // a run of them
  for (uint32_t level = 0; level < p.levels(); level += 2) {
    const std::vector<uint8_t> bytes = encode(p, src.view(), level);
    for (DType dt : {DType::f32, DType::f16, DType::bf16})
      expect_same(*gpu, p, bytes, dt, 53, 9, fmt::format("outliers level {} {}", level, dtype_name(dt)));
  }
}

TEST_P(GpuCase, BitExactOnRandomData) {
  const Profile& p = profile_of(cs());
  REQUIRE_GPU(gpu, p);
  for (uint64_t tokens : {3u, 61u}) {
    const KvCache src = make_random(cs().geom, tokens, 1234, tokens);
    for (uint32_t level : {0u, p.levels() / 2, p.levels() - 1}) {
      const std::vector<uint8_t> bytes = encode(p, src.view(), level);
      expect_same(*gpu, p, bytes, DType::f32, tokens, 1234, fmt::format("random {} tokens level {}", tokens, level));
      expect_same(*gpu, p, bytes, DType::bf16, tokens, 1234, fmt::format("random {} tokens level {}", tokens, level));
    }
  }
}

TEST_P(GpuCase, DeviceOutputAndRepeatedDecodes) {
  const Profile& p = profile_of(cs());
  REQUIRE_GPU(gpu, p);
  // Several chunks of different sizes and levels through the same decoder (buffer
  // growth, cached level tables, RoPE tables rebuilt per first position).
  for (int round = 0; round < 2; ++round)
    for (uint64_t tokens : {40u, 5u, 77u}) {
      const KvCache src = synthetic_cache(cs().geom, DType::bf16, tokens, 100 * tokens, cs().rope, tokens + 7);
      const uint32_t level = uint32_t(tokens % p.levels());
      const std::vector<uint8_t> bytes = encode(p, src.view(), level);
      expect_same(*gpu, p, bytes, DType::f16, tokens, 100 * tokens, fmt::format("round {} tokens {}", round, tokens));
    }
}

TEST(GpuDecoderErrors, CorruptAndMismatchedInputIsRejectedLikeTheCpu) {
  const Case& cs = cases()[1];
  const Profile& p = profile_of(cs);
  REQUIRE_GPU(gpu, p);
  const KvCache src = synthetic_cache(cs.geom, DType::f16, 30, 0, cs.rope, 5);
  const std::vector<uint8_t> bytes = encode(p, src.view(), 3);
  KvCache out = KvCache::create(cs.geom, DType::f16, 30, 0).value();
  // Truncated at a few offsets.
  for (size_t cut : {size_t(0), size_t(10), size_t(70), bytes.size() / 2, bytes.size() - 1}) {
    const std::span<const uint8_t> part(bytes.data(), cut);
    EXPECT_FALSE(gpu->decode_to_host(part, out.view()).ok()) << "cut at " << cut;
  }
  // Payload byte flips: the checksum catches them, as on the CPU.
  std::vector<uint8_t> bad = bytes;
  bad[bad.size() - 5] ^= 0x10;
  const Status st = gpu->decode_to_host(bad, out.view());
  EXPECT_EQ(st.code(), StatusCode::corrupt_data) << st.to_string();
  // Wrong view.
  KvCache short_out = KvCache::create(cs.geom, DType::f16, 29, 0).value();
  EXPECT_EQ(gpu->decode_to_host(bytes, short_out.view()).code(), StatusCode::invalid_argument);
  // Another profile.
  const Profile& other = profile_of(cases()[0]);
  const KvCache src0 = synthetic_cache(cases()[0].geom, DType::f16, 12, 0, {}, 1);
  const std::vector<uint8_t> foreign = encode(other, src0.view(), 0);
  KvCache out0 = KvCache::create(cases()[0].geom, DType::f16, 12, 0).value();
  EXPECT_FALSE(gpu->decode_to_host(foreign, out0.view()).ok());
  // Device API argument checks.
  EXPECT_EQ(gpu->decode(bytes, nullptr, 0, DType::f16).code(), StatusCode::invalid_argument);
  // And a good decode still works afterwards.
  expect_same(*gpu, p, bytes, DType::f16, 30, 0, "after errors");
}


std::vector<std::string> names() {
  std::vector<std::string> n;
  for (const Case& c : cases()) n.emplace_back(c.name);
  return n;
}
INSTANTIATE_TEST_SUITE_P(Geometries, GpuCase, ::testing::ValuesIn(names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace kvstream::gpu::test_gpu_decoder

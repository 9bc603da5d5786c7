// Tests for the benchmark baselines (codec/baselines/baseline.hpp): round trips of
// every configuration with per-method error bounds, exact sizes, and robustness to
// truncated and corrupted objects.
#include "codec/baselines/baseline.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvstream/dtype.hpp"
#include "kvstream/kv_model.hpp"

namespace kvstream::codec::baselines {
namespace {

KvGeometry gqa() { return {3, 2, 8, 4, AttentionKind::gqa}; }       // 16 channels
KvGeometry mha_wide() { return {2, 3, 100, 3, AttentionKind::mha}; }  // 300 channels: > 256 tables
KvGeometry mla() { return {2, 1, 40, 8, AttentionKind::mla}; }       // one plane

// KV-like data: per-channel offset and scale (a few outlier channels), tokens a noisy
// random walk so neighbouring tokens are correlated.
KvCache synth(const KvGeometry& g, uint64_t tokens, uint64_t seed) {
  auto cache = KvCache::create(g, DType::f32, tokens).value();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p)
      for (uint32_t c = 0; c < g.channels(); ++c) {
        const float scale = (c % 7 == 3) ? 8.0f : 0.5f + 0.1f * float(c % 5);
        const float offset = (c % 11 == 0) ? 3.0f : 0.0f;
        float walk = 0.0f;
        for (uint64_t t = 0; t < tokens; ++t) {
          walk = 0.8f * walk + 0.6f * n01(rng);
          cache.set(l, p, t, c, offset + scale * (walk + 0.3f * n01(rng)));
        }
      }
  return cache;
}

float row_absmax(const KvCache& x, uint32_t l, uint32_t p, uint64_t t) {
  float m = 0;
  for (uint32_t c = 0; c < x.geometry().channels(); ++c) m = std::max(m, std::fabs(x.at(l, p, t, c)));
  return m;
}

// Largest |error| allowed for each element of a decode of `in` by `codec`.
// Writes bounds in the packed layout [layer][plane][token][channel].
std::vector<float> error_bounds(const BaselineCodec& codec, const KvCache& in) {
  const KvGeometry& g = in.geometry();
  const uint32_t L = g.layers, P = g.planes(), C = g.channels();
  const uint64_t T = in.tokens();
  std::vector<float> b(size_t(L) * P * T * C, 0.0f);
  auto at = [&](uint32_t l, uint32_t p, uint64_t t, uint32_t c) -> float& {
    return b[((size_t(l) * P + p) * T + t) * C + c];
  };
  const std::string m = codec.method(), cfg = codec.config();
  constexpr float rel = 1.0f + 1.0f / 256;  // fp16 rounding of scales and float slack
  if (m == "fp16" || m == "zstd-fp16") return b;  // exact after fp16 rounding (checked separately)
  if (m == "int-token" || m == "cachegen-code" || m == "cachegen-static") {
    int bits = 0, kb = 0, vb = 0;
    if (m == "int-token") {
      EXPECT_EQ(std::sscanf(cfg.c_str(), "int%d", &bits), 1);
    }
    if (m == "cachegen-static") {
      if (std::sscanf(cfg.c_str(), "kb%d-vb%d", &kb, &vb) != 2) {
        EXPECT_EQ(std::sscanf(cfg.c_str(), "kb%d", &kb), 1);
      }
    }
    for (uint32_t l = 0; l < L; ++l)
      for (uint32_t p = 0; p < P; ++p) {
        int qmax;
        if (m == "int-token")
          qmax = (1 << (bits - 1)) - 1;
        else if (m == "cachegen-code")
          qmax = cachegen_layer_bins(L, l, p, 32, 16) / 2 - 1;
        else
          qmax = (p == 0 ? kb : vb) / 2 - 1;
        for (uint64_t t = 0; t < T; ++t) {
          const float e = row_absmax(in, l, p, t) / float(qmax) * 0.5f * rel + 1e-6f;
          for (uint32_t c = 0; c < C; ++c) at(l, p, t, c) = e;
        }
      }
    return b;
  }
  if (m == "kivi") {
    int kb = 0, vb = 0, grp = 0;
    if (std::sscanf(cfg.c_str(), "k%dv%dg%d", &kb, &vb, &grp) != 3) {
      EXPECT_EQ(std::sscanf(cfg.c_str(), "k%dg%d", &kb, &grp), 2);
    }
    for (uint32_t l = 0; l < L; ++l)
      for (uint32_t p = 0; p < P; ++p) {
        const int levels = (1 << (p == 0 ? kb : vb)) - 1;
        auto bound = [&](float lo, float hi) {
          return (hi - lo) / float(levels) * 0.5f * rel + std::max(std::fabs(lo), std::fabs(hi)) / 512 + 1e-6f;
        };
        if (p == 0) {
          for (uint64_t t0 = 0; t0 < T; t0 += grp)
            for (uint32_t c = 0; c < C; ++c) {
              const uint64_t t1 = std::min<uint64_t>(T, t0 + grp);
              float lo = INFINITY, hi = -INFINITY;
              for (uint64_t t = t0; t < t1; ++t) lo = std::min(lo, in.at(l, p, t, c)), hi = std::max(hi, in.at(l, p, t, c));
              for (uint64_t t = t0; t < t1; ++t) at(l, p, t, c) = bound(lo, hi);
            }
        } else {
          const uint32_t cg = std::min<uint32_t>(uint32_t(grp), C);
          for (uint64_t t = 0; t < T; ++t)
            for (uint32_t c0 = 0; c0 < C; c0 += cg) {
              const uint32_t c1 = std::min(C, c0 + cg);
              float lo = INFINITY, hi = -INFINITY;
              for (uint32_t c = c0; c < c1; ++c) lo = std::min(lo, in.at(l, p, t, c)), hi = std::max(hi, in.at(l, p, t, c));
              for (uint32_t c = c0; c < c1; ++c) at(l, p, t, c) = bound(lo, hi);
            }
        }
      }
    return b;
  }
  if (m == "cachegen-paper") {
    int grp = 0, khi = 0, klo = 0, vhi = 0, vlo = 0;
    if (std::sscanf(cfg.c_str(), "g%d-kb%d-%d-vb%d-%d", &grp, &khi, &klo, &vhi, &vlo) != 5) {
      EXPECT_EQ(std::sscanf(cfg.c_str(), "g%d-kb%d-%d", &grp, &khi, &klo), 3);
    }
    for (uint32_t l = 0; l < L; ++l)
      for (uint32_t p = 0; p < P; ++p) {
        const int qd = (p == 0 ? cachegen_layer_bins(L, l, p, khi, klo) : cachegen_layer_bins(L, l, p, vhi, vlo)) / 2 - 1;
        float anchor_max = 0;
        for (uint64_t t = 0; t < T; ++t) {
          float e;
          if (t % uint64_t(grp) == 0) {
            anchor_max = row_absmax(in, l, p, t);
            e = anchor_max / 127.0f * 0.5f * rel + 1e-6f;
          } else {
            e = (row_absmax(in, l, p, t) + anchor_max * rel) / float(qd) * 0.5f * rel + 1e-6f;
          }
          for (uint32_t c = 0; c < C; ++c) at(l, p, t, c) = e;
        }
      }
    return b;
  }
  ADD_FAILURE() << "unknown method " << m;
  return b;
}

// Encodes, decodes into an f32 cache and checks every element against its bound.
std::vector<uint8_t> check_round_trip(const BaselineCodec& codec, const KvCache& in) {
  SCOPED_TRACE(codec.name() + " tokens=" + std::to_string(in.tokens()));
  auto enc = codec.encode(in.view());
  EXPECT_TRUE(enc.ok()) << enc.status().to_string();
  if (!enc.ok()) return {};
  auto out = KvCache::create(in.geometry(), DType::f32, in.tokens()).value();
  const Status st = codec.decode(*enc, out.view());
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (!st.ok()) return {};
  const auto bounds = error_bounds(codec, in);
  const bool exact = codec.method() == "fp16" || codec.method() == "zstd-fp16";
  const KvGeometry& g = in.geometry();
  size_t i = 0, bad = 0;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p)
      for (uint64_t t = 0; t < in.tokens(); ++t)
        for (uint32_t c = 0; c < g.channels(); ++c, ++i) {
          const float x = in.at(l, p, t, c), y = out.at(l, p, t, c);
          const bool good = exact ? y == f16_to_f32(f32_to_f16(x)) : std::fabs(x - y) <= bounds[i];
          if (!good && bad++ < 3)
            ADD_FAILURE() << "l" << l << " p" << p << " t" << t << " c" << c << ": " << x << " -> " << y
                          << " bound " << bounds[i];
        }
  return std::move(enc).value();
}

void train_all(std::vector<std::unique_ptr<BaselineCodec>>& all, const KvGeometry& g) {
  const KvCache s1 = synth(g, 45, 101), s2 = synth(g, 23, 202);
  const std::vector<KvView> samples{s1.view(), s2.view()};
  for (auto& c : all) {
    const Status st = c->train(samples);
    ASSERT_TRUE(st.ok()) << c->name() << ": " << st.to_string();
  }
}

TEST(Baselines, SweepNamesAreUniqueAndStable) {
  const auto all = make_all_baselines(gqa());
  std::set<std::string> names;
  for (const auto& c : all) EXPECT_TRUE(names.insert(c->name()).second) << c->name();
  EXPECT_EQ(all.size(), 1u + 4u + 48u + 2u + 1u + 49u + 3u);
  EXPECT_EQ(all.front()->name(), "fp16/fp16");
  EXPECT_TRUE(names.count("int-token/int8"));
  EXPECT_TRUE(names.count("kivi/k3v2g64"));
  EXPECT_TRUE(names.count("zstd-fp16/zstd19"));
  EXPECT_TRUE(names.count("cachegen-code/bins32-16"));
  EXPECT_TRUE(names.count("cachegen-static/kb16-vb8"));
  EXPECT_TRUE(names.count("cachegen-paper/g10-kb32-16-vb32-16"));
  EXPECT_TRUE(names.count("cachegen-paper/g10-kb64-32-vb64-32"));
  const auto single = make_all_baselines(mla());
  std::set<std::string> mla_names;
  for (const auto& c : single) EXPECT_TRUE(mla_names.insert(c->name()).second) << c->name();
  EXPECT_EQ(single.size(), 1u + 4u + 12u + 2u + 1u + 7u + 3u);
  EXPECT_TRUE(mla_names.count("kivi/k3g64"));
  EXPECT_TRUE(mla_names.count("cachegen-static/kb16"));
  EXPECT_TRUE(mla_names.count("cachegen-paper/g10-kb32-16"));
}

TEST(Baselines, CachegenLayerMapping) {
  // 32 layers: as LMCache ships it.
  EXPECT_EQ(cachegen_layer_bins(32, 9, 0, 32, 16), 32);
  EXPECT_EQ(cachegen_layer_bins(32, 10, 0, 32, 16), 16);
  EXPECT_EQ(cachegen_layer_bins(32, 1, 1, 32, 16), 32);
  EXPECT_EQ(cachegen_layer_bins(32, 2, 1, 32, 16), 16);
  EXPECT_EQ(cachegen_layer_bins(80, 10, 0, 32, 16), 16);
  // 22 layers (TinyLlama): K 7 layers, V 2 layers high.
  EXPECT_EQ(cachegen_layer_bins(22, 6, 0, 32, 16), 32);
  EXPECT_EQ(cachegen_layer_bins(22, 7, 0, 32, 16), 16);
  EXPECT_EQ(cachegen_layer_bins(22, 1, 1, 32, 16), 32);
  EXPECT_EQ(cachegen_layer_bins(22, 2, 1, 32, 16), 16);
  EXPECT_EQ(cachegen_layer_bins(1, 0, 1, 32, 16), 32);
}

class RoundTrip : public ::testing::TestWithParam<int> {};

TEST_P(RoundTrip, EveryConfiguration) {
  const KvGeometry g = GetParam() == 0 ? gqa() : GetParam() == 1 ? mha_wide() : mla();
  auto all = make_all_baselines(g);
  train_all(all, g);
  const std::vector<uint64_t> token_counts = GetParam() == 1 ? std::vector<uint64_t>{1, 37}
                                                             : std::vector<uint64_t>{1, 37, 130};
  for (uint64_t T : token_counts) {
    const KvCache in = synth(g, T, 7 + T);
    for (const auto& c : all) check_round_trip(*c, in);
  }
}
INSTANTIATE_TEST_SUITE_P(Geometries, RoundTrip, ::testing::Values(0, 1, 2));

TEST(Baselines, SizesCountEveryByte) {
  const KvGeometry g = gqa();
  const KvCache in = synth(g, 37, 3);
  const uint64_t n = g.elements_per_token() * 37, rows = uint64_t(g.layers) * g.planes() * 37;
  EXPECT_EQ(make_fp16()->encode(in.view())->size(), 17 + 2 * n);
  for (int b : {8, 6, 5, 4}) EXPECT_EQ(make_int_token(b)->encode(in.view())->size(), 17 + 1 + 2 * rows + (n * b + 7) / 8);
  // kivi k3v2g32: K groups ceil(37/32) x 16 channels, V groups 37 x ceil(16/16).
  const uint64_t params = g.layers * (2 * 16 + 37 * 1);
  const uint64_t bits = uint64_t(g.layers) * 37 * 16 * (3 + 2);
  EXPECT_EQ(make_kivi(3, 2, 32)->encode(in.view())->size(), 17 + 4 + 4 * params + (bits + 7) / 8);
  // Entropy-coded and zstd objects are smaller than raw fp16 on this smooth data.
  const size_t fp16 = 17 + 2 * n;
  EXPECT_LT(make_zstd_fp16(19)->encode(in.view())->size(), fp16);
  EXPECT_LT(make_int_token(4)->encode(in.view())->size(), make_int_token(8)->encode(in.view())->size());
}

TEST(Baselines, EntropyCodedBeatsBitPackingWhenTrained) {
  const KvGeometry g = gqa();
  const KvCache train1 = synth(g, 400, 11), test = synth(g, 256, 12);
  const std::vector<KvView> samples{train1.view()};
  auto st = make_cachegen_static(16, 16);  // 15 levels per token, like int4
  ASSERT_TRUE(st->train(samples).ok());
  const size_t coded = st->encode(test.view())->size();
  const size_t int4 = make_int_token(4)->encode(test.view())->size();
  EXPECT_LT(coded, int4);
  auto paper = make_cachegen_paper(10, 32, 16, 32, 16);
  ASSERT_TRUE(paper->train(samples).ok());
  EXPECT_TRUE(paper->encode(test.view()).ok());
}

TEST(Baselines, DecodesIntoOtherDtypesAndLayouts) {
  const KvGeometry g = gqa();
  const KvCache in = synth(g, 21, 5);
  for (const auto& codec : {make_int_token(8), make_kivi(4, 2, 32), make_cachegen_code()}) {
    const auto enc = codec->encode(in.view()).value();
    auto ref = KvCache::create(g, DType::f32, 21).value();
    ASSERT_TRUE(codec->decode(enc, ref.view()).ok());
    auto half = KvCache::create(g, DType::f16, 21).value();
    ASSERT_TRUE(codec->decode(enc, half.view()).ok());
    // A strided bf16 view with padded channels.
    const int64_t C = g.channels(), pad = C + 3;
    std::vector<uint16_t> mem(size_t(g.layers) * 2 * 21 * pad, 0);
    const KvStrides strides{2 * 21 * pad, 21 * pad, pad, 1};
    auto bview = KvView::strided(mem.data(), DType::bf16, g, 21, strides).value();
    ASSERT_TRUE(codec->decode(enc, bview).ok());
    std::vector<float> row(C);
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t p = 0; p < 2; ++p)
        for (uint64_t t = 0; t < 21; ++t) {
          bview.load_row(l, p, t, row.data());
          for (uint32_t c = 0; c < C; ++c) {
            const float r = ref.at(l, p, t, c);
            ASSERT_EQ(half.at(l, p, t, c), f16_to_f32(f32_to_f16(r)));
            ASSERT_EQ(row[c], bf16_to_f32(f32_to_bf16(r)));
          }
        }
  }
}

TEST(Baselines, MismatchedOutputIsRejected) {
  const KvCache in = synth(gqa(), 10, 1);
  for (const auto& codec : {make_fp16(), make_int_token(6), make_kivi(2, 2, 64), make_zstd_fp16(3), make_cachegen_code()}) {
    const auto enc = codec->encode(in.view()).value();
    auto fewer = KvCache::create(gqa(), DType::f32, 9).value();
    EXPECT_EQ(codec->decode(enc, fewer.view()).code(), StatusCode::invalid_argument) << codec->name();
    auto other = KvCache::create(mla(), DType::f32, 10).value();
    EXPECT_EQ(codec->decode(enc, other.view()).code(), StatusCode::invalid_argument) << codec->name();
  }
  // An object of one method is not accepted by another.
  const auto enc = make_int_token(8)->encode(in.view()).value();
  auto out = KvCache::create(gqa(), DType::f32, 10).value();
  EXPECT_EQ(make_kivi(2, 2, 64)->decode(enc, out.view()).code(), StatusCode::corrupt_data);
  EXPECT_EQ(make_int_token(4)->decode(enc, out.view()).code(), StatusCode::corrupt_data);
}

TEST(Baselines, UntrainedOrMistrainedStaticIsAClearError) {
  const KvCache in = synth(gqa(), 12, 1);
  auto st = make_cachegen_static(16, 8);
  EXPECT_TRUE(st->needs_training());
  auto enc = st->encode(in.view());
  ASSERT_FALSE(enc.ok());
  EXPECT_EQ(enc.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(enc.status().message().find("not trained"), std::string::npos) << enc.status().to_string();
  auto out = KvCache::create(gqa(), DType::f32, 12).value();
  EXPECT_FALSE(st->decode(std::vector<uint8_t>(40, 0), out.view()).ok());
  auto paper = make_cachegen_paper(10, 32, 16, 32, 16);
  EXPECT_EQ(paper->encode(in.view()).status().code(), StatusCode::invalid_argument);

  // No samples; mixed geometries; chunk of another geometry than trained on.
  EXPECT_FALSE(st->train({}).ok());
  const KvCache a = synth(gqa(), 5, 2), b = synth(mla(), 5, 3);
  const std::vector<KvView> mixed{a.view(), b.view()};
  EXPECT_FALSE(st->train(mixed).ok());
  const std::vector<KvView> two_planes{a.view()};
  EXPECT_FALSE(make_cachegen_static(16, 0)->train(two_planes).ok());  // kb16 is a single-plane (MLA) setting
  const std::vector<KvView> good{a.view()};
  ASSERT_TRUE(st->train(good).ok());
  EXPECT_EQ(st->encode(synth(mha_wide(), 4, 1).view()).status().code(), StatusCode::invalid_argument);

  // Objects coded under other trained tables are refused.
  auto st2 = make_cachegen_static(16, 8);
  const KvCache c = synth(gqa(), 30, 99);
  const std::vector<KvView> other{c.view()};
  ASSERT_TRUE(st2->train(other).ok());
  const auto obj = st2->encode(in.view()).value();
  EXPECT_EQ(st->decode(obj, out.view()).code(), StatusCode::corrupt_data);
}

TEST(Baselines, NonFiniteInputsAreTamed) {
  const KvGeometry g = gqa();
  KvCache in = synth(g, 5, 4);
  in.set(0, 0, 1, 3, std::numeric_limits<float>::quiet_NaN());
  in.set(1, 1, 2, 5, std::numeric_limits<float>::infinity());
  for (const auto& codec : {make_int_token(8), make_kivi(4, 4, 32), make_cachegen_code()}) {
    const auto enc = codec->encode(in.view());
    ASSERT_TRUE(enc.ok()) << codec->name();
    auto out = KvCache::create(g, DType::f32, 5).value();
    ASSERT_TRUE(codec->decode(*enc, out.view()).ok()) << codec->name();
    EXPECT_TRUE(std::isfinite(out.at(0, 0, 1, 3))) << codec->name();
    EXPECT_NEAR(out.at(1, 1, 2, 5), 65504.0f, 65504.0f / 64) << codec->name();
  }
}

// Truncated objects fail; bit-flipped objects fail or decode to finite values.
TEST(Baselines, CorruptObjectsNeverCrash) {
  for (const KvGeometry& g : {gqa(), mla()}) {
    auto all = make_all_baselines(g);
    train_all(all, g);
    const KvCache in = synth(g, 23, 77);
    std::mt19937_64 rng(5);
    std::set<std::string> seen;
    for (const auto& codec : all) {
      // One or two configurations per method keep this fast.
      if (!seen.insert(codec->method()).second && codec->config() != "k2v1g128" && codec->config() != "k2g128")
        continue;
      SCOPED_TRACE(codec->name());
      const auto enc = codec->encode(in.view()).value();
      auto out = KvCache::create(g, DType::f32, 23).value();
      for (size_t len : {size_t(0), size_t(1), size_t(16), size_t(17), enc.size() / 2, enc.size() - 1}) {
        const std::vector<uint8_t> cut(enc.begin(), enc.begin() + std::min(len, enc.size()));
        EXPECT_FALSE(codec->decode(cut, out.view()).ok()) << "length " << len;
      }
      auto longer = enc;
      longer.push_back(0);
      EXPECT_FALSE(codec->decode(longer, out.view()).ok());
      const bool raw = codec->method() == "fp16";
      for (int trial = 0; trial < 60; ++trial) {
        auto bad = enc;
        const int flips = 1 + trial % 3;
        for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] ^= uint8_t(1u << (rng() % 8));
        auto o = KvCache::create(g, DType::f32, 23).value();
        if (codec->decode(bad, o.view()).ok() && !raw) {
          for (uint32_t l = 0; l < g.layers; ++l)
            for (uint32_t p = 0; p < g.planes(); ++p)
              for (uint32_t t = 0; t < 23; ++t)
                for (uint32_t c = 0; c < g.channels(); ++c) ASSERT_TRUE(std::isfinite(o.at(l, p, t, c)));
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvstream::codec::baselines

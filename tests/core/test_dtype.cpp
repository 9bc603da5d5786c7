#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "kvstream/dtype.hpp"

namespace kvstream::test_dtype {

namespace {
// Reference fp32 -> fp16 by exhaustive nearest search over the 63488 finite halves,
// ties broken to the even mantissa: slow but obviously right.
uint16_t ref_f16(float f) {
  if (std::isnan(f)) return 0x7e00;
  const double x = f;
  const double ax = std::fabs(x);
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (ax >= 65520.0) return sign | 0x7c00;
  // Binary search the monotone positive halves 0x0000..0x7bff.
  int lo = 0, hi = 0x7bff;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (double(f16_to_f32(uint16_t(mid))) <= ax) lo = mid; else hi = mid - 1;
  }
  if (lo == 0x7bff) return sign | uint16_t(lo);
  const double a = f16_to_f32(uint16_t(lo)), b = f16_to_f32(uint16_t(lo + 1));
  int pick;
  if (ax - a < b - ax) pick = lo;
  else if (ax - a > b - ax) pick = lo + 1;
  else pick = (lo % 2 == 0) ? lo : lo + 1;
  return sign | uint16_t(pick);
}
}  // namespace

TEST(DType, F16ToF32AndBackIsExactForEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << h;
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(DType, F32ToF16RoundsToNearestEven) {
  // Halfway cases between neighbouring halves must go to the even one.
  for (uint32_t h = 0; h < 0x7bff; h += 7) {
    const double a = f16_to_f32(uint16_t(h)), b = f16_to_f32(uint16_t(h + 1));
    const float mid = float((a + b) / 2);  // exact in fp32
    ASSERT_EQ(double(mid), (a + b) / 2);
    EXPECT_EQ(f32_to_f16(mid), (h % 2 == 0) ? h : h + 1) << h;
    EXPECT_EQ(f32_to_f16(-mid), 0x8000 | ((h % 2 == 0) ? h : h + 1)) << h;
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float f = std::bit_cast<float>(bits(rng));
    if (i % 2) f = std::ldexp(float(i % 1000) / 997.0f, -(i % 30)) * ((i % 4) ? 1 : -1);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), ref_f16(f)) << f;
  }
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16(1e-9f), 0);  // below half the smallest subnormal
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
}

TEST(DType, Bf16RoundTripAndRounding) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_f32(uint16_t(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_bf16(f), b);
  }
  // 1 + 2^-8 is halfway between bf16 1.0 (even) and 1 + 2^-7: ties to even -> 1.0.
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even) -> up.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
}

TEST(DType, ConvertElementsMatchesScalar) {
  std::vector<float> src(1000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(float(i)) * 100.0f;
  for (DType t : {DType::f16, DType::bf16, DType::f32}) {
    std::vector<uint8_t> buf(src.size() * dtype_size(t));
    convert_elements(src.data(), DType::f32, buf.data(), t, src.size());
    std::vector<float> back(src.size());
    convert_elements(buf.data(), t, back.data(), DType::f32, src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      float expect = src[i];
      if (t == DType::f16) expect = f16_to_f32(f32_to_f16(src[i]));
      if (t == DType::bf16) expect = bf16_to_f32(f32_to_bf16(src[i]));
      ASSERT_EQ(back[i], expect);
    }
  }
  EXPECT_EQ(*parse_dtype("fp16"), DType::f16);
  EXPECT_FALSE(parse_dtype("int8").ok());
}

}  // namespace kvstream::test_dtype

// Element types of a KV cache and exact conversions between them.
//
// fp32 -> fp16 and fp32 -> bf16 round to nearest, ties to even, as GPUs do; NaN stays
// NaN (quiet), overflow goes to infinity. fp16/bf16 -> fp32 is exact.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kvstream/status.hpp"

namespace kvstream {

/// Storage type of one KV element. Values travel on the wire: keep them stable.
enum class DType : uint8_t { f32 = 0, f16 = 1, bf16 = 2 };

/// Bytes per element.
constexpr size_t dtype_size(DType t) noexcept { return t == DType::f32 ? 4 : 2; }

/// "f32", "f16" or "bf16".
std::string_view dtype_name(DType t) noexcept;

/// Parses "f32"/"fp32"/"float32", "f16"/"fp16"/"float16", "bf16"/"bfloat16".
Result<DType> parse_dtype(std::string_view name);

/// IEEE binary16 bits -> float (exact).
inline float f16_to_f32(uint16_t h) noexcept {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: value = man * 2^-24, exact in fp32.
    const float mag = float(man) * 0x1p-24f;
    return sign ? -mag : mag;
  }
  uint32_t bits;
  if (exp == 31)
    bits = sign | 0x7f800000u | (man << 13);  // inf or NaN (payload kept)
  else
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  return std::bit_cast<float>(bits);
}

/// float -> IEEE binary16 bits, round to nearest even.
inline uint16_t f32_to_f16(float f) noexcept {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u)  // inf or NaN; NaN made quiet so it cannot turn into inf
    return uint16_t(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u));
  if (ax >= 0x477ff000u)  // rounds to >= 65520: overflow to inf
    return uint16_t(sign | 0x7c00u);
  if (ax < 0x38800000u) {
    // Result is subnormal (or zero) in fp16: scale so the integer part is the fp16
    // mantissa and let the float adder round to nearest even for us.
    const float mag = std::bit_cast<float>(ax) * 0x1p24f;  // exact: power-of-two scale
    const float rounded = mag + 0x1p23f - 0x1p23f;          // RNE to integer (mag < 2^10)
    return uint16_t(sign | uint16_t(rounded));
  }
  // Normal: re-bias the exponent and round the 13 dropped mantissa bits to nearest even.
  uint32_t h = ((ax >> 13) - (112u << 10));
  const uint32_t rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carry may bump the exponent: correct
  return uint16_t(sign | h);
}

/// bfloat16 bits -> float (exact).
inline float bf16_to_f32(uint16_t b) noexcept { return std::bit_cast<float>(uint32_t(b) << 16); }

/// float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
inline uint16_t f32_to_bf16(float f) noexcept {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

/// Reads element `i` of an array of type `t` as float.
inline float load_element(const void* base, DType t, size_t i) noexcept {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
  }
  return 0.0f;
}

/// Writes `v` as element `i` of an array of type `t` (rounded to nearest even).
inline void store_element(void* base, DType t, size_t i, float v) noexcept {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = v; return;
    case DType::f16: static_cast<uint16_t*>(base)[i] = f32_to_f16(v); return;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(v); return;
  }
}

/// Converts `n` elements between types (a plain copy when the types match).
void convert_elements(const void* src, DType src_type, void* dst, DType dst_type, size_t n) noexcept;

}  // namespace kvstream

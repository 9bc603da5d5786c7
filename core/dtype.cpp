#include "kvstream/dtype.hpp"

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kvstream {

namespace {
#if defined(__x86_64__)
// F16C converts 8 lanes per instruction with the same round-to-nearest-even (and NaN
// quieting) as f32_to_f16, so results are identical to the scalar path.
__attribute__((target("avx2,f16c"))) void f32_to_f16_f16c(const float* s, uint16_t* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) d[i] = f32_to_f16(s[i]);
}
// GCC 12 warns falsely inside its own AVX-512 headers (GCC bug 105593).
#pragma GCC diagnostic push
#if !defined(__clang__)  // a GCC-only warning: clang warns of the unknown name
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// The same conversion 16 lanes at a time (AVX-512F has the 512-bit form of vcvtps2ph).
__attribute__((target("avx512f"))) void f32_to_f16_avx512(const float* s, uint16_t* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  f32_to_f16_f16c(s + i, d + i, n - i);
}
#pragma GCC diagnostic pop
__attribute__((target("avx2,f16c"))) void f16_to_f32_f16c(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = f16_to_f32(s[i]);
}
// CPUID leaf 1, ECX bit 29 is F16C (asked directly: older compilers do not know the
// "f16c" name in __builtin_cpu_supports).
bool cpu_has_f16c() {
  unsigned a, b, c, d;
  return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
const bool kHaveF16c = cpu_has_f16c();
const bool kHaveAvx512 = kHaveF16c && __builtin_cpu_supports("avx512f");
#else
constexpr bool kHaveF16c = false;
#endif
}  // namespace

std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "unknown";
}

Result<DType> parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::f32;
  if (name == "f16" || name == "fp16" || name == "float16") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  return make_status(StatusCode::invalid_argument, "unknown element type '{}' (expected f32, f16 or bf16)", name);
}

void convert_elements(const void* src, DType src_type, void* dst, DType dst_type, size_t n) noexcept {
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * dtype_size(src_type));
    return;
  }
  // Specialised loops so the compiler can vectorise the common fp32 <-> 16-bit cases.
  if (src_type == DType::f32) {
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
    if (dst_type == DType::f16) {
#if defined(__x86_64__)
      if (kHaveAvx512) return f32_to_f16_avx512(s, d, n);
      if (kHaveF16c) return f32_to_f16_f16c(s, d, n);
#endif
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(s[i]);
    }
    else
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    return;
  }
  if (dst_type == DType::f32) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = static_cast<float*>(dst);
    if (src_type == DType::f16) {
#if defined(__x86_64__)
      if (kHaveF16c) return f16_to_f32_f16c(s, d, n);
#endif
      for (size_t i = 0; i < n; ++i) d[i] = f16_to_f32(s[i]);
    }
    else
      for (size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) store_element(dst, dst_type, i, load_element(src, src_type, i));
}

}  // namespace kvstream

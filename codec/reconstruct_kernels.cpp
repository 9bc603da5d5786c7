// Reconstruction kernels of the CPU decoder (see reconstruct_kernels.hpp).
#include "codec/reconstruct_kernels.hpp"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvstream::codec {

// The stages below are cloned for AVX-512 and AVX2 so their loops vectorise on
// either machine; the arithmetic (no fused multiply-add, fixed order) is identical.
// Not under ThreadSanitizer: the clones' ifunc resolver runs while the library is
// relocated, before TSan's runtime is up, and its instrumented entry crashes the load.
#if defined(__SANITIZE_THREAD__)
#define KVS_CLONED_FOR_SIMD
#else
#define KVS_CLONED_FOR_SIMD __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
typedef float v16f __attribute__((vector_size(64)));

namespace {

// Fixed 16-wide groups: rows are short (tens of channels), and the compiler's own
// vectorization of the row loop spends a runtime alias check per row.
KVS_CLONED_FOR_SIMD void dequant_portable(const int8_t* __restrict q, const float* __restrict pred,
                                          const float* __restrict step, float* __restrict out, uint32_t rows,
                                          uint32_t n) {
  for (uint32_t r = 0; r < rows; ++r, q += n, out += n) {
    size_t c = 0;
    for (; c + 16 <= n; c += 16) {
      const int8_t* qc = q + c;
      const float* pc = pred + c;
      const float* sc = step + c;
      float* oc = out + c;
      for (size_t i = 0; i < 16; ++i) oc[i] = pc[i] + float(qc[i]) * sc[i];
    }
    for (; c < n; ++c) out[c] = pred[c] + float(q[c]) * step[c];
  }
}

#if defined(__x86_64__)
// GCC 12 warns falsely inside its own AVX-512 headers (GCC bug 105593).
#pragma GCC diagnostic push
#if !defined(__clang__)  // a GCC-only warning: clang warns of the unknown name
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// The same with 512-bit vectors (the compiler's AVX-512 clone above keeps to 256 bits
// and widens int8 in three shuffles).
__attribute__((target("avx512f"))) void dequant_avx512(const int8_t* q, const float* pred, const float* step,
                                                       float* out, uint32_t rows, uint32_t n) {
  for (uint32_t r = 0; r < rows; ++r, q += n, out += n) {
    size_t c = 0;
    for (; c + 16 <= n; c += 16) {
      const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(q + c))));
      _mm512_storeu_ps(out + c, _mm512_add_ps(_mm512_loadu_ps(pred + c), _mm512_mul_ps(f, _mm512_loadu_ps(step + c))));
    }
    for (; c < n; ++c) out[c] = pred[c] + float(q[c]) * step[c];
  }
}
#pragma GCC diagnostic pop
#endif

using DequantFn = void (*)(const int8_t*, const float*, const float*, float*, uint32_t, uint32_t);
DequantFn pick_dequant() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return dequant_avx512;
#endif
  return dequant_portable;
}

}  // namespace

void dequant_tile(const int8_t* __restrict q, const float* __restrict pred, const float* __restrict step,
                  float* __restrict out, uint32_t rows, uint32_t n) {
  static const DequantFn fn = pick_dequant();
  fn(q, pred, step, out, rows, n);
}

namespace {

// x = mean + scale * (U y) over blocks of n channels. For each channel the products
// of the nonzero components are summed in increasing component order, without fused
// multiply-add, and a zero result is emitted as +0. Adding a zero product changes at
// most the sign of a zero sum, which that last rule erases, so decoders may skip zero
// components or not (this one skips those zero in both of a pair of rows) and still
// agree bit for bit.

// R consecutive rows (stride C) of one block of 16 * NV channels: components j < n
// of row r are y[r * C + j], and bit j of nz[r * words + j / 32] is set when it may be
// nonzero. The accumulators stay in registers; each row's sums are an add chain of
// their own, so R rows keep R * NV chains in flight and hide the add latency. A
// component is visited when any of the rows has it: the others add a zero product,
// which the rule above allows.
template <int NV, int R>
inline __attribute__((always_inline)) void klt_block_rows(const float* ut, const float* y, const uint32_t* nz,
                                                          uint32_t C, uint32_t words, uint32_t shift, float* z) {
  constexpr uint32_t n = 16 * NV;
  v16f acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = v16f{};
  for (uint32_t j0 = 0; j0 < n; j0 += 32) {
    const uint32_t keep = n - j0 < 32 ? (1u << (n - j0)) - 1 : ~0u;
    uint32_t m = 0;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) m |= nz[size_t(r) * words + j0 / 32] >> shift;
    m &= keep;
    while (m) {
      const uint32_t j = j0 + uint32_t(__builtin_ctz(m));
      m &= m - 1;
      const float* col = ut + size_t(j) * n;
      float a[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) a[r] = y[size_t(r) * C + j];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        v16f c;
        std::memcpy(&c, col + 16 * v, sizeof c);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) acc[r][v] += c * a[r];
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) std::memcpy(z + size_t(r) * C + 16 * v, &acc[r][v], sizeof(v16f));
}

// Any block size: the same sums, one row at a time.
inline void klt_block_generic(const float* ut, uint32_t n, const float* y, float* z) {
  for (uint32_t c = 0; c < n; ++c) z[c] = 0.0f;
  for (uint32_t j = 0; j < n; ++j) {
    const float yj = y[j];
    if (yj == 0.0f) continue;
    const float* col = ut + size_t(j) * n;
    for (uint32_t c = 0; c < n; ++c) z[c] += col[c] * yj;
  }
}

}  // namespace

namespace {
KVS_CLONED_FOR_SIMD void dequant32_portable(const int32_t* __restrict q, const float* __restrict pred,
                                            const float* __restrict step, float* __restrict out, uint32_t rows,
                                            uint32_t n) {
  for (uint32_t r = 0; r < rows; ++r, q += n, out += n)
    for (uint32_t c = 0; c < n; ++c) out[c] = pred[c] + float(q[c]) * step[c];
}
}  // namespace

void dequant_tile(const int32_t* __restrict q, const float* __restrict pred, const float* __restrict step,
                  float* __restrict out, uint32_t rows, uint32_t n) {
  dequant32_portable(q, pred, step, out, rows, n);
}

namespace {
void masks32_portable(const int32_t* q, uint32_t rows, uint32_t C, uint32_t* nz) {
  const uint32_t words = (C + 31) / 32;
  for (uint32_t r = 0; r < rows; ++r, q += C, nz += words)
    for (uint32_t w = 0; w < words; ++w) {
      uint32_t m = 0;
      for (uint32_t c = w * 32; c < std::min(C, w * 32 + 32); ++c) m |= uint32_t(q[c] != 0) << (c % 32);
      nz[w] = m;
    }
}
#if defined(__x86_64__)
__attribute__((target("avx512f"))) void masks32_avx512(const int32_t* q, uint32_t rows, uint32_t C, uint32_t* nz) {
  if (C % 32 != 0) return masks32_portable(q, rows, C, nz);
  const uint32_t words = C / 32;
  for (uint32_t r = 0; r < rows; ++r, q += C, nz += words)
    for (uint32_t w = 0; w < words; ++w) {
      const __m512i a = _mm512_loadu_si512(q + 32 * w), b = _mm512_loadu_si512(q + 32 * w + 16);
      nz[w] = uint32_t(_mm512_test_epi32_mask(a, a)) | uint32_t(_mm512_test_epi32_mask(b, b)) << 16;
    }
}
#endif
using Masks32Fn = void (*)(const int32_t*, uint32_t, uint32_t, uint32_t*);
Masks32Fn pick_masks32() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return masks32_avx512;
#endif
  return masks32_portable;
}
}  // namespace

void nonzero_masks(const int32_t* q, uint32_t rows, uint32_t C, uint32_t* nz) {
  static const Masks32Fn fn = pick_masks32();
  fn(q, rows, C, nz);
}

namespace {
void ids_portable(const int32_t* __restrict q, const uint8_t* __restrict zero, const uint8_t* __restrict nonzero,
                  uint8_t* __restrict ids, uint32_t rows, uint32_t C) {
  for (uint32_t r = 0; r < rows; ++r, q += C, ids += C)
    for (uint32_t c = 0; c < C; ++c) ids[c] = q[c] != 0 ? nonzero[c] : zero[c];
}
#if defined(__x86_64__)
// A byte blend under the nonzero mask of 16 indices (the compiler's own version
// packs the 32-bit compare results down to bytes, several times slower).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void ids_avx512(const int32_t* __restrict q,
                                                                      const uint8_t* __restrict zero,
                                                                      const uint8_t* __restrict nonzero,
                                                                      uint8_t* __restrict ids, uint32_t rows,
                                                                      uint32_t C) {
  if (C % 16 != 0) return ids_portable(q, zero, nonzero, ids, rows, C);
  for (uint32_t r = 0; r < rows; ++r, q += C, ids += C)
    for (uint32_t c = 0; c < C; c += 16) {
      const __m512i v = _mm512_loadu_si512(q + c);
      const __mmask16 m = _mm512_test_epi32_mask(v, v);
      const __m128i z = _mm_loadu_si128((const __m128i*)(zero + c)), n = _mm_loadu_si128((const __m128i*)(nonzero + c));
      _mm_storeu_si128((__m128i*)(ids + c), _mm_mask_blend_epi8(m, z, n));
    }
}
#endif
using IdsFn = void (*)(const int32_t*, const uint8_t*, const uint8_t*, uint8_t*, uint32_t, uint32_t);
IdsFn pick_ids() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) return ids_avx512;
#endif
  return ids_portable;
}
}  // namespace

void refinement_ids(const int32_t* __restrict q, const uint8_t* __restrict zero, const uint8_t* __restrict nonzero,
                    uint8_t* __restrict ids, uint32_t rows, uint32_t C) {
  static const IdsFn fn = pick_ids();
  fn(q, zero, nonzero, ids, rows, C);
}

KVS_CLONED_FOR_SIMD void refine_indices(int32_t* __restrict q, const int8_t* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const int32_t sgn = q[i] >> 31;  // 0 or -1: s mirrored when the coarse index is negative
    q[i] = 3 * q[i] + ((int32_t(s[i]) ^ sgn) - sgn);
  }
}

KVS_CLONED_FOR_SIMD void widen_indices(const int8_t* __restrict s, int32_t* __restrict q, size_t n) {
  for (size_t i = 0; i < n; ++i) q[i] = s[i];
}

void nonzero_masks(const int8_t* q, uint32_t rows, uint32_t C, uint32_t* nz) {
  const uint32_t words = (C + 31) / 32;
  for (uint32_t r = 0; r < rows; ++r, q += C, nz += words) {
    uint32_t c = 0;
#if defined(__x86_64__)
    const __m128i zero = _mm_setzero_si128();  // SSE2 is in every x86-64 build
    for (; c + 32 <= C; c += 32) {
      const uint32_t lo = uint32_t(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadu_si128((const __m128i*)(q + c)), zero)));
      const uint32_t hi =
          uint32_t(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadu_si128((const __m128i*)(q + c + 16)), zero)));
      nz[c / 32] = ~(lo | hi << 16);
    }
#endif
    for (; c < C; ++c) {
      if (c % 32 == 0) nz[c / 32] = 0;
      nz[c / 32] |= uint32_t(q[c] != 0) << (c % 32);
    }
  }
}

KVS_CLONED_FOR_SIMD void klt_inverse_tile(const float* ut, uint32_t n, uint32_t C, uint32_t rows, const float* y,
                                          const uint32_t* nz, const float* mean, const float* scale, float* z,
                                          float* out) {
  const uint32_t words = (C + 31) / 32;
  for (uint32_t r0 = 0; r0 < rows; r0 += kKltRows) {
    const uint32_t live = std::min(kKltRows, rows - r0);
    const float* yr = y + size_t(r0) * C;
    const uint32_t* nr = nz + size_t(r0) * words;
    for (uint32_t b = 0; b < C; b += n) {
      const float* blk = ut + size_t(b) * n;
      const uint32_t shift = b % 32;  // a 16-channel block may start mid-word
      const uint32_t* nb = nr + b / 32;
      switch (n) {
        case 16: klt_block_rows<1, 4>(blk, yr + b, nb, C, words, shift, z + b); break;
        case 32: klt_block_rows<2, 4>(blk, yr + b, nb, C, words, shift, z + b); break;
        case 64: klt_block_rows<4, 4>(blk, yr + b, nb, C, words, shift, z + b); break;
        case 128:
          klt_block_rows<8, 2>(blk, yr + b, nb, C, words, shift, z + b);
          klt_block_rows<8, 2>(blk, yr + 2 * size_t(C) + b, nb + 2 * words, C, words, shift, z + 2 * size_t(C) + b);
          break;
        default:
          for (uint32_t k = 0; k < live; ++k) klt_block_generic(blk, n, yr + size_t(k) * C + b, z + size_t(k) * C + b);
      }
    }
    for (uint32_t k = 0; k < live; ++k) {
      float* o = out + size_t(r0 + k) * C;
      const float* zz = z + size_t(k) * C;
      for (uint32_t c = 0; c < C; ++c) o[c] = (mean[c] + scale[c] * zz[c]) + 0.0f;  // + 0: a zero is +0
    }
  }
}

KVS_CLONED_FOR_SIMD void rope_forward_tile(
    float* x, uint32_t rows, uint32_t first_t, uint32_t heads, uint32_t head_dim, uint32_t rot, bool interleaved,
    const float* ec, const float* es, const uint32_t* partner) {
  float tmp[1024];
  for (uint32_t r = 0; r < rows; ++r) {
    const float* c = ec + size_t(first_t + r) * rot;
    const float* s = es + size_t(first_t + r) * rot;
    for (uint32_t h = 0; h < heads; ++h) {
      float* v = x + (size_t(r) * heads + h) * head_dim;
      if (interleaved) {
        // Pairs are adjacent: the partner of d is d ^ 1, which vectorises as a shuffle.
        for (uint32_t d = 0; d < rot; ++d) tmp[d] = v[d] * c[d] + v[d ^ 1u] * s[d];
      } else {
        for (uint32_t d = 0; d < rot; ++d) tmp[d] = v[d] * c[d] + v[partner[d]] * s[d];
      }
      for (uint32_t d = 0; d < rot; ++d) v[d] = tmp[d];
    }
  }
}


namespace {

// One group of `W` channels per token (W a multiple of 2M): out[i] = v[i] * ec[i] +
// v[i ^ M] * es[i]. With W and M constants the partner is a fixed in-register
// permutation, or (M >= 16) the other half of the group.
template <uint32_t W, uint32_t M>
inline __attribute__((always_inline)) void rope_rows_fixed(float* x, uint32_t rows, uint32_t C, const float* ec,
                                                           const float* es) {
  for (uint32_t r = 0; r < rows; ++r, x += C, ec += W, es += W)
    for (uint32_t c0 = 0; c0 < C; c0 += W) {
      float* v = x + c0;
      float t[W];
      for (uint32_t i = 0; i < W; ++i) t[i] = v[i] * ec[i] + v[i ^ M] * es[i];
      for (uint32_t i = 0; i < W; ++i) v[i] = t[i];
    }
}

}  // namespace

KVS_CLONED_FOR_SIMD void rope_forward_rows(float* x, uint32_t rows, uint32_t channels, uint32_t width,
                                           uint32_t xor_mask, const float* ecw, const float* esw) {
#define KVS_ROPE_CASE(W, M) \
  if (width == (W) && xor_mask == (M)) return rope_rows_fixed<(W), (M)>(x, rows, channels, ecw, esw)
  KVS_ROPE_CASE(16, 1);
  KVS_ROPE_CASE(16, 2);
  KVS_ROPE_CASE(16, 4);
  KVS_ROPE_CASE(16, 8);
  KVS_ROPE_CASE(32, 1);
  KVS_ROPE_CASE(32, 16);
  KVS_ROPE_CASE(64, 1);
  KVS_ROPE_CASE(64, 32);
  KVS_ROPE_CASE(128, 1);
  KVS_ROPE_CASE(128, 64);
  KVS_ROPE_CASE(256, 1);
  KVS_ROPE_CASE(256, 128);
#undef KVS_ROPE_CASE
  float t[256];  // any other width of at most 256
  for (uint32_t r = 0; r < rows; ++r, x += channels, ecw += width, esw += width)
    for (uint32_t c0 = 0; c0 < channels; c0 += width) {
      float* v = x + c0;
      for (uint32_t i = 0; i < width; ++i) t[i] = v[i] * ecw[i] + v[i ^ xor_mask] * esw[i];
      for (uint32_t i = 0; i < width; ++i) v[i] = t[i];
    }
}

}  // namespace kvstream::codec

// The arithmetic of reconstruction, shared by the CPU decoder's stages: dequantize,
// inverse KLT, RoPE. Every decoder (CPU, CUDA) must produce the same bits, so each
// kernel documents its order of operations; none uses fused multiply-add (the codec
// is built with -ffp-contract=off). Internal to the codec.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvstream::codec {

/// out[r][c] = pred[c] + float(q[r][c]) * step[c] for `rows` rows of n channels.
void dequant_tile(const int8_t* __restrict q, const float* __restrict pred, const float* __restrict step,
                  float* __restrict out, uint32_t rows, uint32_t n);

/// The same for the 32-bit indices of a progressive stream's refined layers.
void dequant_tile(const int32_t* __restrict q, const float* __restrict pred, const float* __restrict step,
                  float* __restrict out, uint32_t rows, uint32_t n);

/// Progressive streams: per row of C indices, the table id of each channel's
/// refinement symbol: nonzero[c] where q is nonzero, else zero[c].
void refinement_ids(const int32_t* __restrict q, const uint8_t* __restrict zero, const uint8_t* __restrict nonzero,
                    uint8_t* __restrict ids, uint32_t rows, uint32_t C);
/// q[i] = 3 q[i] + s[i], s mirrored where q[i] < 0 (refine_index, n at a time).
void refine_indices(int32_t* __restrict q, const int8_t* __restrict s, size_t n);
/// q[i] = s[i] (the base layer's indices, widened).
void widen_indices(const int8_t* __restrict s, int32_t* __restrict q, size_t n);

/// Per row of C symbols, (C + 31) / 32 words: bit c % 32 of word c / 32 set when
/// symbol c is nonzero.
void nonzero_masks(const int8_t* q, uint32_t rows, uint32_t C, uint32_t* nz);
void nonzero_masks(const int32_t* q, uint32_t rows, uint32_t C, uint32_t* nz);

/// x = (mean + scale * (U y)) + 0 per row over blocks of n channels (ut: each block's
/// U^T, row-major). For each channel the products of the nonzero components are summed
/// in increasing component order and a zero result is emitted as +0, so a decoder may
/// skip zero components or not and still agree bit for bit. `nz` (as nonzero_masks
/// writes it) must have the bit of every nonzero y; extra bits only cost time.
/// Rows go kKltRows at a time: y and nz must be readable for `rows` rounded up to a
/// multiple of kKltRows (the extra rows are computed and dropped; zero their masks).
/// `z` holds kKltRows * C floats.
inline constexpr uint32_t kKltRows = 4;
void klt_inverse_tile(const float* ut, uint32_t n, uint32_t C, uint32_t rows, const float* y, const uint32_t* nz,
                      const float* mean, const float* scale, float* z, float* out);

/// RoPE forward rotation of `rows` token rows of `heads` heads in place: for rotary
/// channel d < rot, out[d] = x[d] * ec[d] + x[partner[d]] * es[d], with table row
/// first_t + r (ec, es: rot floats per token).
void rope_forward_tile(float* x, uint32_t rows, uint32_t first_t, uint32_t heads, uint32_t head_dim, uint32_t rot,
                       bool interleaved, const float* ec, const float* es, const uint32_t* partner);

/// The same rotation for whole heads of a power-of-two size, where the partner of
/// channel d is d ^ xor_mask: rows of `channels` floats in groups of `width`, with
/// per-token tables of `width` entries (a head's, repeated when heads are narrower
/// than a vector). Same products and sums as rope_forward_tile, hence the same bits.
void rope_forward_rows(float* x, uint32_t rows, uint32_t channels, uint32_t width, uint32_t xor_mask,
                       const float* ecw, const float* esw);

}  // namespace kvstream::codec

// Embedded quantization of a progressive stream (docs/bitstream.md, "Progressive
// streams"): one value's indices at every layer, the refinement symbol that takes a
// layer's index to the next one's, and the context that symbol is coded in. The
// encoder and the profile builder both quantize through here. Internal to the codec.
#pragma once

#include <cmath>
#include <cstdint>

#include "kvstream/codec.hpp"

namespace kvstream::codec {

/// The coarser layer's index of a finer index: the nearest multiple of kRefineRatio,
/// divided by it (round-to-nearest cells of step 3D are unions of three cells of step
/// D, so the coarser index is a function of the finer one).
inline int32_t coarser_index(int32_t q) {
  const int32_t a = q + 1;
  return a >= 0 ? a / 3 : -((2 - a) / 3);
}
static_assert(kRefineRatio == 3, "coarser_index and refinement_symbol are written for a ratio of 3");

/// Largest base index; beyond it a value is sent exact (as in a single-level stream).
inline constexpr int32_t kMaxBaseIndex = 127;

/// Quantizes residual r (in the units of the finest layer's step: r * inv_finest) into
/// the indices of every layer, q[0] the base's, q[layers - 1] the finest's. False when
/// the value must be sent exact: not finite, or its base index out of range.
inline bool layered_indices(float r, float inv_finest, uint32_t layers, int32_t* q) {
  const float f = std::nearbyint(r * inv_finest);
  if (!(std::fabs(f) <= 16777216.0f)) return false;  // also NaN
  q[layers - 1] = int32_t(f);
  for (uint32_t k = layers - 1; k > 0; --k) q[k - 1] = coarser_index(q[k]);
  return q[0] >= -kMaxBaseIndex && q[0] <= kMaxBaseIndex;
}

/// The refinement symbol from index `coarse` to `fine` (-1, 0 or 1), mirrored when
/// the coarse index is negative so that "towards zero" has one sign in both halves.
inline int8_t refinement_symbol(int32_t coarse, int32_t fine) {
  const int32_t r = fine - 3 * coarse;
  return int8_t(coarse < 0 ? -r : r);
}
/// The finer index from a coarse index and a refinement symbol (the inverse).
inline int32_t refine_index(int32_t coarse, int8_t s) { return 3 * coarse + (coarse < 0 ? -s : s); }
/// The context a refinement symbol is coded in: 0 when the coarse index is 0 (the
/// symbol is symmetric there), 1 otherwise (it leans towards zero).
inline uint32_t refinement_context(int32_t coarse) { return coarse != 0; }

}  // namespace kvstream::codec

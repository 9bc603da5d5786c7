// Constants and helpers of the coded-matrix format (rans.hpp) shared by the rANS
// encoder (rans.cpp) and decoders (rans_decode.cpp). Internal to the codec.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "codec/entropy/rans.hpp"

namespace kvstream::codec {
namespace rans_format {

inline constexpr int kLanes = RANS_LANES;
inline constexpr uint32_t kProbMask = PROB_SCALE - 1;
inline constexpr uint32_t kStateLow = 1u << 16;  // states live in [kStateLow, 2^32)
inline constexpr uint8_t kEscapeByte = 0x80;     // decode-table symbol byte meaning "escape"
inline constexpr uint8_t kStreamVersion = 1;
inline constexpr uint8_t kTableVersion = 1;
inline constexpr size_t kHeaderBytes = 12;
inline constexpr size_t kStateBytes = 4 * kLanes;
inline constexpr size_t kStepWordBytes = 2 * kLanes;  // most word bytes one step can consume

static_assert(PROB_BITS >= 10 && PROB_BITS <= 12, "decode entry packs 8 + 2*PROB_BITS bits into 32");
static_assert(kLanes == 32, "SIMD kernels are written for 32 lanes");
// Lets SIMD loops read a full step's window whenever the word pointer has not
// passed the end of the word stream.
static_assert(kStateBytes >= kStepWordBytes);

inline uint32_t load_u16(const uint8_t* p) { return uint32_t(p[0]) | (uint32_t(p[1]) << 8); }
inline uint32_t load_u32(const uint8_t* p) { return load_u16(p) | (load_u16(p + 2) << 16); }

}  // namespace rans_format

/// The shape checks rans_encode and rans_decode share; n receives rows * cols. With
/// `check_ids` false the ids are not read (rans_decode_chain: they are written as
/// decoding goes, and checked then with rans_check_ids).
Status rans_check_shape(const RansTables& tables, std::span<const uint8_t> table_of_col, size_t rows, size_t cols,
                        size_t& n, bool check_ids = true);
/// invalid_argument when an id is not below tables.size(); names the first such column.
Status rans_check_ids(const RansTables& tables, std::span<const uint8_t> ids, size_t first_col = 0);

}  // namespace kvstream::codec

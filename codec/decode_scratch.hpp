// What a CPU decoder keeps between chunks (DecodeScratch::Impl): the buffers of both
// stream kinds, so steady-state decoding does not allocate. Internal to the codec.
#pragma once

#include <array>
#include <span>
#include <vector>

#include "codec/plane_reconstruct.hpp"

namespace kvstream::codec {

/// Matrices of a single-level stream entropy-decoded together: the AVX-512 kernel
/// interleaves four streams.
inline constexpr uint32_t kDecodeGroup = 4;

/// One matrix of a single-level stream between its entropy decode and its reconstruction.
struct MatrixWork {
  uint32_t l = 0, pl = 0;
  uint32_t n_plain_rows = 0, n_anchor_rows = 0;
  std::span<const uint8_t> plain_code, anchor_code;
  const uint8_t* table_plain = nullptr;
  const uint8_t* table_anchor = nullptr;
  std::vector<int8_t> plain, anchors;
  ExactValues exact;
};

/// One group of planes of a progressive stream (docs/bitstream.md, "Groups").
struct LayeredScratch {
  std::vector<ExactValues> exact;               // per plane of the group
  std::vector<std::span<const uint8_t>> code;   // per plane: its base coded matrix
  std::vector<int8_t> sym;                      // base or refinement symbols (a chain's layers end to end)
  std::vector<int32_t> q;                       // the group's indices at the layer reached so far
  std::vector<uint8_t> ids;                     // table id of every symbol of a refinement layer or chain
};

}  // namespace kvstream::codec

namespace kvstream::codec {

struct DecodeScratch::Impl {
  std::array<MatrixWork, kDecodeGroup> work;
  std::vector<float> pred;
  PlaneScratch plane;
  MatrixPlan plan;
  RopeTable rope;  // kept across chunks: see RopeTable::ensure
  LayeredScratch layered;
};

}  // namespace kvstream::codec

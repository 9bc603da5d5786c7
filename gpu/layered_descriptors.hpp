// The host half of the GPU decoder's work on a prefix of a progressive stream
// (bitstream version 2, docs/bitstream.md "Progressive streams"): the checks of
// codec::decode_chunk that need no entropy decoding (header against the profile, the
// prefix's extent, every substream's checksum, exact-value lists, rANS headers and
// start states) and the kernels' work list: the base layer's matrices, then one step per
// refinement layer (the recent rows' layers first), each decoded with its level's
// tables and table ids taken from the coarser indices. Plain C++. Internal to gpu/.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "codec/layered_format.hpp"
#include "gpu/cuda_kernels.hpp"
#include "kvstream/codec.hpp"

namespace kvstream::gpu::detail {

struct LayeredDescriptors {
  codec::LayeredHeader header;
  codec::PrefixExtent extent;
  // Per (layer, plane): plain_sym_off indexes its [tokens][C] indices in q
  // ([plane][tokens][C]); step, recent_step and split from the layer its group reached.
  std::vector<PlaneDesc> planes;
  std::vector<uint32_t> list_index;  // outliers and exact values of every plane
  std::vector<float> list_value;
  std::vector<MatDesc> mats;         // every coded matrix, in the order of `steps`
  std::vector<std::string> mat_where;
  /// One rANS launch: the base (every plane's matrix, symbols into [plane][tokens][C],
  /// table ids from the level's plain role) or a refinement layer's rows (one matrix per
  /// group of planes present, symbols and per-symbol table ids [plane][rows][C]).
  struct Step {
    uint32_t level = 0;      // the profile level whose tables decode it
    uint32_t first_mat = 0, n_mats = 0;
    bool refine = false;
    uint32_t planes = 0;     // refine: planes [0, planes) carry this layer
    uint32_t row0 = 0, rows = 0;
  };
  std::vector<Step> steps;
};

/// Parses and checks `bytes`, a prefix of a progressive stream of `profile` that ends at
/// a substream boundary. Errors: those codec::decode_chunk gives for the same defects
/// found without decoding (corrupt_data; invalid_argument for another profile).
Status parse_layered_chunk(const codec::Profile& profile, std::span<const uint64_t> ut_off,
                           std::span<const uint8_t> bytes, LayeredDescriptors& d);

}  // namespace kvstream::gpu::detail

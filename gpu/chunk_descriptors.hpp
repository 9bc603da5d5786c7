// The host half of the GPU decoder's work on a single-level chunk (bitstream version
// 1): every check of the CPU decoder that needs no entropy decoding (header, profile,
// payload checksum, each substream's framing, outlier lists, rANS headers and start
// states), and the descriptors the kernels read. What remains (the words each rANS
// lane consumes, its escapes, its final state) is checked on the device
// (cuda_decoder.cu, the verdict kernel). Plain C++. Internal to gpu/.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "codec/bitstream.hpp"
#include "gpu/cuda_kernels.hpp"
#include "kvstream/codec.hpp"

namespace kvstream::gpu::detail {

struct ChunkDescriptors {
  codec::ChunkHeader header;
  std::vector<MatDesc> mats;          // offsets relative to the chunk's first byte
  std::vector<PlaneDesc> planes;
  std::vector<uint32_t> list_index;   // outliers and exact values of every plane
  std::vector<float> list_value;
  std::vector<std::string> mat_where; // per matrix, what an error names ("layer l plane p")
};

/// Frames the coded matrix of n symbols at bytes[at, at + len) into `m` (word and escape
/// offsets, start states) with the CPU decoder's checks: its header, its size (equal
/// to `len` when `whole`, else at most), its word and escape counts, its start states.
/// Returns its size. Errors: corrupt_data naming `where`.
Result<size_t> frame_matrix(std::span<const uint8_t> bytes, size_t at, size_t len, uint64_t n, bool whole, MatDesc& m,
                            const std::string& where);

/// Parses and checks `bytes` (a chunk of `profile`); `ut_off` gives each (layer,
/// plane)'s offset in the device's concatenated KLT bases. Errors: those of
/// codec::decode_chunk for any defect found without decoding (corrupt_data,
/// invalid_argument for another profile, unsupported for a progressive stream).
Status parse_chunk(const codec::Profile& profile, std::span<const uint64_t> ut_off, std::span<const uint8_t> bytes,
                   ChunkDescriptors& d);

}  // namespace kvstream::gpu::detail

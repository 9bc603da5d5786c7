// Internal interface between the GPU decoder's host code (cuda_decoder_host.cpp,
// plain C++) and its kernels (cuda_decoder.cu; cuda_layered.cu for the refinement
// layers of progressive streams). Plain structs only, so the kernels' translation
// units need none of the codec's headers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvstream::gpu::detail {

inline constexpr int kLanes = 32;       // rANS lanes per coded matrix (format constant)
inline constexpr int kProbBits = 11;    // codec::PROB_BITS (checked by a static_assert on the host side)

/// One coded matrix (the plain or the anchor rows of one (layer, plane)).
struct MatDesc {
  uint64_t words_off;     // byte offset of the first 16-bit word in the chunk buffer
  uint64_t escapes_off;   // byte offset of the raw escape bytes
  uint64_t sym_off;       // where its rows*cols int8 symbols go in the symbol buffer
  uint64_t table_of_off;  // offset of its column -> table id array in the launch's table id buffer
  uint32_t n_words;
  uint32_t n_escapes;
  uint32_t rows;
  uint32_t cols;
  uint32_t state[kLanes];  // start states (the encoder's final states)
};

/// Error bits a matrix's decode reports (0: ok).
enum : uint32_t { kErrWords = 1, kErrEscapes = 2, kErrState = 4 };

/// One (layer, plane) to reconstruct.
struct PlaneDesc {
  uint64_t plain_sym_off;   // symbols of the plain rows ([rows][C] int8)
  uint64_t anchor_sym_off;  // symbols of the anchor rows (when has_anchor)
  uint64_t chan_off;        // (layer * planes + plane) * C: index of channel 0 in the per-channel arrays
  uint64_t ut_off;          // offset of U^T (blocks) in the transform buffer (when block > 0)
  uint32_t out_begin, out_count;        // outliers (quantized domain), into the outlier arrays
  uint32_t exact_begin, exact_count;    // KLT exact values, into the same arrays
  uint32_t block;           // KLT block size, 0 for identity planes
  uint32_t has_anchor;      // 1 when some channel uses the anchor predictor
  uint32_t rotate;          // 1 when RoPE is redone on this plane
  uint32_t plane_index;     // layer * planes + plane (output slab)
  // The level's base step of rows [0, split), and of rows [split, tokens) (a
  // progressive stream's recent rows, which may be a layer finer); a single-level
  // chunk has one step and split = tokens.
  float step;
  float recent_step;
  uint32_t split;
};

/// Device pointers of a profile (level independent) and of one level.
struct ProfileDev {
  const float* mean;          // per channel, [layer][plane][C]
  const float* step_scale;
  const uint8_t* predictor;   // codec::Predictor values
  const float* transform_t;   // all planes' U^T, concatenated
};
struct LevelDev {
  const uint32_t* dec;        // RansTables::decode_table(), 2^kProbBits entries per table
  const uint8_t* table_of;    // [role][layer][plane][C]
};

/// Everything one chunk's kernels read and write.
struct ChunkLaunch {
  const uint8_t* chunk;       // the whole bitstream on the device
  const MatDesc* mats;
  uint32_t n_mats;
  int8_t* syms;
  const int32_t* q;           // progressive streams: the refined indices, [plane][token][C] (null: syms)
  uint32_t* mat_err;          // one word per matrix
  const PlaneDesc* planes;
  uint32_t n_planes;
  const uint32_t* list_index; // outliers and exact values: flat index t * C + c
  const float* list_value;
  const float* rope_ec;       // [tokens][rot], from codec::RopeTable
  const float* rope_es;
  const uint32_t* rope_partner;
  uint32_t rot;
  uint32_t head_dim;
  uint32_t channels;
  uint32_t tokens;
  uint32_t group;
  ProfileDev prof;
  LevelDev level;
  // The output (output_plan.hpp): element (plane_index, t, c) of the chunk is written
  // at out_row0[plane_index] + out_token[t] + out_chan[c] (bytes); packed, strided and
  // paged device KV alike.
  const uint64_t* out_row0;
  const int64_t* out_token;
  const int64_t* out_chan;
  int dtype;                  // kvstream::DType value: 0 f32, 1 f16, 2 bf16
  uint32_t* verdict;          // 2 words: first failing matrix + 1 (0: every matrix passed), its error bits
};

/// Bytes of dynamic shared memory the reconstruction kernel needs per block.
size_t reconstruct_shared_bytes(uint32_t channels);
/// Raises the kernel's dynamic shared memory limit to `bytes` (0 on success, else a cudaError_t).
int prepare_reconstruct(size_t bytes);
/// Enqueue the rANS kernel (symbols, per-matrix error words) and then the
/// reconstruction kernel (output) on `stream` (a cudaStream_t). Each returns 0 or the
/// cudaError_t of its launch.
int launch_rans(const ChunkLaunch& c, void* stream);
int launch_reconstruct(const ChunkLaunch& c, void* stream);
/// Enqueue the rANS kernel over `n` matrices with the given decode tables and table
/// ids (a progressive stream's layers each have a level's tables; refinement layers
/// take their table ids from the coarser indices, per symbol).
int launch_rans_mats(const uint8_t* chunk, const MatDesc* mats, uint32_t n, const uint32_t* dec,
                     const uint8_t* table_of, int8_t* syms, uint32_t* err, void* stream);

/// One refinement layer's rows of a progressive stream, over planes [0, planes):
/// rows [row0, row0 + rows) of each plane's [tokens][C] indices in `q`; its symbols
/// and per-symbol table ids are laid out [plane][rows][C].
struct RefineRows {
  int32_t* q;
  uint8_t* ids;
  const int8_t* sym;
  const uint8_t* zero_tables;     // [plane][C]: table of a symbol whose coarser index is 0
  const uint8_t* nonzero_tables;  // [plane][C]: otherwise
  uint32_t planes, tokens, channels, row0, rows;
};
/// Widens `n` int8 base indices into int32 (q = sym).
int launch_widen(const int8_t* sym, int32_t* q, uint64_t n, void* stream);
/// Table id of every refinement symbol, from its coarser index (codec's refinement_ids).
int launch_refinement_ids(const RefineRows& r, void* stream);
/// Applies the decoded refinement symbols to the indices (codec's refine_indices).
int launch_refine(const RefineRows& r, void* stream);

/// Enqueue the integrity verdict: the per-matrix error words reduced, on the device,
/// to c.verdict (the first failing matrix, so the host names it as the CPU would).
int launch_verdict(const ChunkLaunch& c, void* stream);

}  // namespace kvstream::gpu::detail

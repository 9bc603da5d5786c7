// The KV cache model that runtimes hand to kvstream: geometry, RoPE parameters,
// element type, token range, and a view over the runtime's own memory
// (contiguous/strided, or paged through a block table as vLLM lays it out).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvstream/dtype.hpp"
#include "kvstream/status.hpp"

namespace kvstream {

/// How queries share KV heads. MLA caches one latent vector per token (one plane).
enum class AttentionKind : uint8_t { mha = 0, gqa = 1, mla = 2 };

/// Shape of a model's KV cache.
struct KvGeometry {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;   ///< KV heads per layer (1 for MLA: the latent is a single head)
  uint32_t head_dim = 0;   ///< channels per head (for MLA: the latent width)
  uint32_t q_heads = 0;    ///< query heads (== kv_heads for MHA; a multiple for GQA; informative for MLA)
  AttentionKind kind = AttentionKind::mha;

  /// Planes per layer: K and V (2), or the single latent of MLA (1).
  [[nodiscard]] constexpr uint32_t planes() const noexcept { return kind == AttentionKind::mla ? 1u : 2u; }
  /// Channels of one token in one plane: kv_heads * head_dim.
  [[nodiscard]] constexpr uint32_t channels() const noexcept { return kv_heads * head_dim; }
  /// Elements one token occupies across all layers and planes.
  [[nodiscard]] constexpr uint64_t elements_per_token() const noexcept {
    return uint64_t(layers) * planes() * channels();
  }
  /// Checks that the shape is coherent (non-zero sizes, GQA divisibility, MLA single head).
  [[nodiscard]] Status validate() const;
  bool operator==(const KvGeometry&) const = default;
};

/// Which channels RoPE rotates together.
enum class RopePairing : uint8_t {
  interleaved = 0,  ///< (2i, 2i+1): llama2.c, GPT-J, Meta's reference Llama
  half = 1,         ///< (i, i + rotary_dim/2): GPT-NeoX and Hugging Face Llama
};

/// Rotary position embedding as applied to K, so that a codec may undo it and code K
/// before rotation, where its channels have stable statistics.
struct RopeParams {
  bool enabled = false;
  float base = 10000.0f;
  uint32_t rotary_dim = 0;  ///< channels of each head that rotate (0: the whole head)
  RopePairing pairing = RopePairing::interleaved;

  bool operator==(const RopeParams&) const = default;
};

/// Rotates one head vector in place for `position` (inverse = true undoes it).
/// `head` has `head_dim` floats.
void rope_rotate(float* head, uint32_t head_dim, int64_t position, const RopeParams& rope, bool inverse) noexcept;

/// Half-open range of token positions [begin, end).
struct TokenRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  [[nodiscard]] constexpr uint64_t size() const noexcept { return end > begin ? end - begin : 0; }
  bool operator==(const TokenRange&) const = default;
};

/// Element strides (not bytes) of a contiguous or strided layout.
struct KvStrides {
  int64_t layer = 0;
  int64_t plane = 0;
  int64_t token = 0;
  int64_t channel = 1;
};

/// Strides of the packed layout [layer][plane][token][channel] for `tokens` tokens.
KvStrides packed_strides(const KvGeometry& g, uint64_t tokens) noexcept;

/// Where a paged block keeps a token's heads: NHD `[block_size][kv_heads][head_dim]`
/// (vLLM's flash-attention layout: a token's channels adjacent) or HND
/// `[kv_heads][block_size][head_dim]` (FlashInfer's and the paged-attention kernels'
/// "HND": one head's slots adjacent).
enum class PagedOrder : uint8_t { nhd = 0, hnd = 1 };

/// Description of a paged cache: each layer has its own base pointer; inside a layer
/// the planes, blocks, slots, heads and channels are strided. vLLM's flash-attention
/// layout per layer, `[2][num_blocks][block_size][kv_heads][head_dim]`, is
/// plane = num_blocks*block_size*C, block = block_size*C, slot = C, channel = 1.
/// Caches that keep K and V in separate tensors give the V planes' bases in
/// `value_base`; blocks(...) fills the whole description for vLLM's block layouts.
struct PagedLayout {
  std::vector<void*> layer_base;   ///< one pointer per layer (its K plane's when value_base is set)
  std::vector<void*> value_base;   ///< empty, or one pointer per layer for its V plane (then plane_stride is unused)
  uint32_t block_size = 0;         ///< tokens per block
  int64_t plane_stride = 0;        ///< elements between the K and V planes of a layer (one base per layer)
  int64_t block_stride = 0;        ///< elements between physical blocks
  int64_t slot_stride = 0;         ///< elements between tokens within a block
  int64_t head_stride = 0;         ///< elements between a token's heads; 0: head_dim * channel_stride (adjacent, NHD)
  int64_t channel_stride = 1;      ///< elements
  uint64_t num_blocks = 0;         ///< physical blocks available (bounds the block table)
  std::vector<uint32_t> block_table;  ///< logical block -> physical block, for this sequence

  /// The dense block layouts of vLLM with K and V in separate tensors per layer, each
  /// `[num_blocks][block_size][kv_heads][head_dim]` (NHD) or
  /// `[num_blocks][kv_heads][block_size][head_dim]` (HND): `keys` and `values` hold
  /// one pointer per layer (`values` empty for MLA's single plane).
  static PagedLayout blocks(PagedOrder order, const KvGeometry& g, uint32_t block_size, uint64_t num_blocks,
                            std::vector<void*> keys, std::vector<void*> values, std::vector<uint32_t> block_table);
};

/// A non-owning view of `tokens()` tokens of a KV cache in someone else's memory.
/// Rows (the channels of one token in one layer and plane) are the unit of access:
/// every codec and copy works row by row, so the same code serves both layouts.
class KvView {
 public:
  KvView() = default;

  /// Packed [layer][plane][token][channel] memory holding `tokens` tokens starting at
  /// position `first_position`.
  static Result<KvView> packed(void* base, DType dtype, const KvGeometry& g, uint64_t tokens,
                               uint64_t first_position = 0);
  /// Any strided layout (strides in elements; may be negative or padded).
  static Result<KvView> strided(void* base, DType dtype, const KvGeometry& g, uint64_t tokens, KvStrides strides,
                                uint64_t first_position = 0);
  /// A paged layout. Logical token t lives in block block_table[t / block_size], slot
  /// t % block_size; the table must cover every token.
  static Result<KvView> paged(PagedLayout layout, DType dtype, const KvGeometry& g, uint64_t tokens,
                              uint64_t first_position = 0);

  [[nodiscard]] const KvGeometry& geometry() const noexcept { return geom_; }
  [[nodiscard]] DType dtype() const noexcept { return dtype_; }
  [[nodiscard]] uint64_t tokens() const noexcept { return tokens_; }
  [[nodiscard]] bool is_paged() const noexcept { return paged_; }
  /// Position of token 0 of this view in its sequence (for RoPE).
  [[nodiscard]] uint64_t first_position() const noexcept { return first_position_; }
  /// Positions covered: [first_position, first_position + tokens).
  [[nodiscard]] TokenRange positions() const noexcept { return {first_position_, first_position_ + tokens_}; }

  /// Address of channel 0 of token `t` (view-relative) in `layer`, `plane`. No bounds check.
  [[nodiscard]] std::byte* row(uint32_t layer, uint32_t plane, uint64_t t) const noexcept;
  /// Distance in elements between consecutive channels of a head.
  [[nodiscard]] int64_t channel_stride() const noexcept { return channel_stride_; }
  /// Offset in elements of channel `c` of a row from the row's address (row()): heads
  /// may lie apart (HND paged blocks).
  [[nodiscard]] int64_t channel_offset(uint32_t c) const noexcept {
    return int64_t(c / geom_.head_dim) * head_stride_ + int64_t(c % geom_.head_dim) * channel_stride_;
  }
  /// True when each row's channels are adjacent (channel stride 1, heads adjacent).
  [[nodiscard]] bool rows_dense() const noexcept {
    return channel_stride_ == 1 && head_stride_ == int64_t(geom_.head_dim);
  }

  /// The sub-view of view-relative tokens [r.begin, r.end).
  [[nodiscard]] Result<KvView> slice(TokenRange r) const;

  /// Reads one row as floats (`out` has channels() floats).
  void load_row(uint32_t layer, uint32_t plane, uint64_t t, float* out) const noexcept;
  /// Writes one row from floats (rounded to the view's type).
  void store_row(uint32_t layer, uint32_t plane, uint64_t t, const float* in) const noexcept;
  /// Writes `n` consecutive rows (tokens t..t+n-1) from n x channels floats; one
  /// conversion pass when those rows are adjacent in memory.
  void store_rows(uint32_t layer, uint32_t plane, uint64_t t, uint64_t n, const float* in) const noexcept;

 private:
  std::byte* base_ = nullptr;
  DType dtype_ = DType::f32;
  KvGeometry geom_{};
  uint64_t tokens_ = 0;
  uint64_t first_position_ = 0;
  uint64_t token_offset_ = 0;  // where token 0 of this view sits in the underlying layout
  int64_t channel_stride_ = 1;
  int64_t head_stride_ = 0;  // elements between the heads of a row
  bool paged_ = false;
  KvStrides strides_{};
  PagedLayout pages_{};
};

/// Copies every element of `src` into `dst` (same geometry and token count; any
/// layouts and element types). This is the gather (paged -> packed) and the scatter
/// (packed -> paged) of the paged path.
Status copy_kv(const KvView& src, const KvView& dst);

/// An owned, packed KV cache: [layer][plane][token][channel] of `dtype`.
class KvCache {
 public:
  KvCache() = default;
  /// Allocates a zeroed cache.
  static Result<KvCache> create(const KvGeometry& g, DType dtype, uint64_t tokens, uint64_t first_position = 0);

  [[nodiscard]] const KvGeometry& geometry() const noexcept { return geom_; }
  [[nodiscard]] DType dtype() const noexcept { return dtype_; }
  [[nodiscard]] uint64_t tokens() const noexcept { return tokens_; }
  [[nodiscard]] uint64_t first_position() const noexcept { return first_position_; }
  [[nodiscard]] std::span<std::byte> bytes() noexcept { return data_; }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return data_; }
  /// RoPE applied to K in this cache (carried so codecs can undo it).
  [[nodiscard]] const RopeParams& rope() const noexcept { return rope_; }
  void set_rope(const RopeParams& r) noexcept { rope_ = r; }

  /// A view of the whole cache (valid while this cache lives and is not resized).
  [[nodiscard]] KvView view() const;
  /// Element (layer, plane, token, channel) as float.
  [[nodiscard]] float at(uint32_t layer, uint32_t plane, uint64_t t, uint32_t c) const noexcept;
  void set(uint32_t layer, uint32_t plane, uint64_t t, uint32_t c, float v) noexcept;
  /// Keeps only the first `tokens` tokens.
  Status truncate(uint64_t tokens);

 private:
  KvGeometry geom_{};
  DType dtype_ = DType::f32;
  uint64_t tokens_ = 0;
  uint64_t first_position_ = 0;
  RopeParams rope_{};
  std::vector<std::byte> data_;
  [[nodiscard]] size_t index(uint32_t layer, uint32_t plane, uint64_t t, uint32_t c) const noexcept {
    return ((size_t(layer) * geom_.planes() + plane) * tokens_ + t) * geom_.channels() + c;
  }
};

}  // namespace kvstream

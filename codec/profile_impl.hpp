// The inside of a codec Profile, shared by the builder, the encoder and the decoders.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "codec/entropy/rans.hpp"
#include "kvstream/codec.hpp"

namespace kvstream::codec {

inline constexpr uint32_t kProfileVersion = 1;
/// Version of a progressive profile: version 1's body and one more byte (so every
/// profile of one level per stream keeps its bytes, and its hash, which bitstreams carry).
inline constexpr uint32_t kProgressiveProfileVersion = 2;
/// Version 2's body and the recent window (two u32): a progressive profile with
/// recent layers. Profiles without keep version 2's bytes and hash.
inline constexpr uint32_t kRecentProfileVersion = 3;
/// Version 3's body and one byte (1): the recent rows lead in every layer
/// (ProfileOptions::recent_lead). Profiles without keep version 3's bytes and hash.
inline constexpr uint32_t kRecentLeadProfileVersion = 4;
inline constexpr uint32_t kMaxLevels = 32;

/// Role of a coded matrix: a chunk's tokens are coded as one matrix of "plain" rows
/// (predictor none/mean, and the deltas of anchor channels), plus, when a (layer,
/// plane) has anchor channels, one matrix of the groups' anchor rows.
/// In a progressive profile's refinement levels the two roles are the two contexts of
/// a refinement symbol (refinement_context): the coarse index 0, and any other.
enum Role : uint32_t { kRolePlain = 0, kRoleAnchor = 1, kRoles = 2 };
inline constexpr uint32_t kRoleCoarseZero = kRolePlain, kRoleCoarseNonzero = kRoleAnchor;

struct Profile::Impl {
  KvGeometry geom{};
  RopeParams rope{};
  bool k_before_rope = false;
  uint32_t group_size = 10;
  // One embedded stream per chunk; levels[levels.size() - 1] is the base layer, level
  // i the prefix through layer levels.size() - 1 - i (no anchor predictors).
  bool progressive = false;
  // A context's last recent_tokens tokens carry recent_layers layers in the base (0: none).
  uint32_t recent_tokens = 0;
  uint32_t recent_layers = 0;
  // The recent rows stay recent_layers ahead in every refinement layer too.
  bool recent_lead = false;
  // Per channel, index (layer * planes + plane) * channels + c.
  std::vector<uint8_t> predictor;
  std::vector<float> mean;
  std::vector<float> step_scale;  // the channel's step = level step * step_scale
  // Per (layer, plane): 0 = channels coded as they are; B = coded in a KLT basis of
  // blocks of B channels: y = U^T ((x - mean) / step_scale), quantized with the level
  // step. transform[lp] holds C/B blocks of B x B row-major U (column j = component j).
  std::vector<uint32_t> transform_block;
  std::vector<std::vector<float>> transform;
  std::vector<std::vector<float>> transform_t;  // derived: each block transposed (decoder)
  struct Level {
    LevelInfo info;
    std::vector<FreqTable> tables;
    // Table id per (role, layer, plane, channel): [role][lp * channels + c].
    std::vector<uint8_t> table_of[kRoles];
    // Derived on load, never serialized.
    std::shared_ptr<const RansTables> rans;
  };
  std::vector<Level> levels;
  // Progressive profiles, derived on load: every refinement layer's tables in one set,
  // layer k's ids shifted past those of layers 1..k-1, so that consecutive layers
  // decode as one chain (rans_decode_chain). Null when the layers' tables together
  // number more than a byte can name (they then decode one layer at a time).
  std::shared_ptr<const RansTables> refine_chain;
  // chain_table_of[k - 1][role]: layer k's table_of[role] with its ids shifted.
  std::vector<std::array<std::vector<uint8_t>, kRoles>> chain_table_of;
  uint64_t hash = 0;

  [[nodiscard]] size_t channels_total() const { return size_t(geom.layers) * geom.planes() * geom.channels(); }
  [[nodiscard]] size_t idx(uint32_t l, uint32_t p, uint32_t c) const {
    return (size_t(l) * geom.planes() + p) * geom.channels() + c;
  }
  /// Progressive profiles: the level of layer k (0 = the base).
  [[nodiscard]] uint32_t level_of_layer(uint32_t k) const { return uint32_t(levels.size()) - 1 - k; }
  [[nodiscard]] uint32_t block_of(size_t lp) const { return transform_block.empty() ? 0 : transform_block[lp]; }
  /// True when some channel of (layer, plane) uses the anchor predictor.
  [[nodiscard]] bool has_anchor(uint32_t l, uint32_t p) const;

  /// Serializes everything but the hash (the hash covers exactly these bytes).
  [[nodiscard]] std::vector<uint8_t> body() const;
  /// Builds the RansTables of every level and the hash; call after any change.
  Status finalize();
};

/// K is rotated back (RoPE undone) before coding when the profile says so.
inline bool unrotates(const Profile::Impl& p, uint32_t plane) {
  return p.k_before_rope && plane == 0 && p.rope.enabled && p.geom.kind != AttentionKind::mla;
}

}  // namespace kvstream::codec

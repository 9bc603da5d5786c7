// The progressive chunk bitstream (version 2): header, substream table, the grouping
// of planes in refinement layers, and which prefixes decode. The format is documented
// in docs/bitstream.md ("Progressive streams"); keep the two in step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/bitstream.hpp"

namespace kvstream::codec {

inline constexpr uint16_t kLayeredVersion = 2;
/// A refinement layer codes its planes in groups of at least this many symbols, so
/// that each coded matrix's fixed 140 bytes stay under 0.02 bits per element.
inline constexpr uint64_t kMinGroupSymbols = 65536;

/// Planes per refinement group and group count, from the geometry and token count.
struct LayeredGrouping {
  uint32_t planes = 0;            // S: layers x planes of the model
  uint32_t planes_per_group = 1;
  uint32_t groups = 1;            // G, per refinement layer
  [[nodiscard]] uint32_t first_plane(uint32_t g) const { return g * planes_per_group; }
  [[nodiscard]] uint32_t end_plane(uint32_t g) const { return std::min(planes, (g + 1) * planes_per_group); }
};
LayeredGrouping layered_grouping(const KvGeometry& g, uint32_t tokens);

/// What a prefix holds: `substreams` whole substreams, each group's rows other than
/// the recent ones refined through layer layers_of_group(g) (the recent rows' layer:
/// LayeredHeader::recent_layer_of_group).
struct PrefixExtent {
  size_t substreams = 0;
  uint32_t full_layers = 0;   // refinement layers present for every group
  uint32_t partial_groups = 0;  // groups of the next layer present
  uint32_t partial_lead = 0;    // lead substreams of the next layer present (recent_lead)
  [[nodiscard]] uint32_t layers_of_group(uint32_t g) const { return full_layers + (g < partial_groups ? 1 : 0); }
};

/// Refinement layers of an n-layer stream that open with the recent rows' next layer:
/// n - 1 - J when the recent rows lead, else none.
inline uint32_t lead_layers_of(uint32_t layers, uint32_t recent_layers, bool lead) {
  return lead ? layers - 1 - recent_layers : 0;
}

/// Header of a progressive stream, as written; offsets are from the stream's start.
/// Header flags: bit 0 K coded before RoPE; bits 1-3 the recent rows' extra layers;
/// bit 4 the recent rows keep that lead in every refinement layer.
inline constexpr uint8_t kFlagKBeforeRope = 1;
inline constexpr uint32_t kRecentLayersShift = 1, kRecentLayersMask = 7;
inline constexpr uint8_t kFlagRecentLead = 16;

struct LayeredHeader {
  ChunkInfo info;                   // info.level: unused (0); info.total_bytes: the whole stream
  uint16_t group_size = 0;
  uint8_t flags = 0;                // kFlagKBeforeRope; recent_layers in bits 1-3
  uint32_t layers = 0;              // n
  LayeredGrouping grouping;
  // The chunk's last `recent_tokens` rows carry `recent_layers` refinement layers in
  // the base layer (0 and 0: none); those layers' groups then hold only the other rows.
  uint32_t recent_tokens = 0;
  uint32_t recent_layers = 0;
  // kFlagRecentLead: the recent rows stay `recent_layers` layers ahead of the others
  // at every layer, not only in the base. Refinement layer k (k <= lead_layers()) then
  // opens with G substreams of the recent rows' layer k + J, and every layer's groups
  // hold the other rows only.
  bool recent_lead = false;
  // Per substream, in stream order: the S base substreams, the recent rows' J x G,
  // then per refinement layer its lead substreams (recent_lead) and its G groups.
  std::vector<uint32_t> sub_bytes;
  std::vector<uint32_t> sub_sum;    // low 32 bits of the substream's xxh3-64
  std::vector<float> distortion;    // per prefix point: after the base, after each refinement substream
  // Derived on parse.
  std::vector<uint64_t> sub_offset;
  uint64_t header_bytes = 0;

  [[nodiscard]] size_t substreams() const { return sub_bytes.size(); }
  /// Substreams of the base layer: the planes', then the recent rows'.
  [[nodiscard]] size_t base_substreams() const { return grouping.planes + size_t(recent_layers) * grouping.groups; }
  /// Index of the recent rows' substream of (layer 1 <= k <= recent_layers, group g).
  [[nodiscard]] size_t recent_index(uint32_t k, uint32_t g) const {
    return grouping.planes + size_t(k - 1) * grouping.groups + g;
  }
  /// Refinement layers that open with the recent rows' next layer (recent_lead).
  [[nodiscard]] uint32_t lead_layers() const { return lead_layers_of(layers, recent_layers, recent_lead); }
  /// Substreams of refinement layer k >= 1: its lead substreams, then its groups.
  [[nodiscard]] size_t layer_substreams(uint32_t k) const {
    return size_t(k <= lead_layers() ? 2 : 1) * grouping.groups;
  }
  /// Index of the first substream of refinement layer k >= 1.
  [[nodiscard]] size_t layer_begin(uint32_t k) const {
    const uint32_t lead = std::min(k - 1, lead_layers());
    return base_substreams() + size_t(k - 1 + lead) * grouping.groups;
  }
  /// Index of the recent rows' substream of layer k + recent_layers, group g, carried in
  /// refinement layer 1 <= k <= lead_layers().
  [[nodiscard]] size_t lead_index(uint32_t k, uint32_t g) const { return layer_begin(k) + g; }
  /// Index of substream (layer k >= 1, group g).
  [[nodiscard]] size_t refine_index(uint32_t k, uint32_t g) const {
    return layer_begin(k) + (k <= lead_layers() ? grouping.groups : 0) + g;
  }
  /// Rows of the chunk that layer k's groups hold (all but the recent ones for k <= J,
  /// or for every k when the recent rows lead).
  [[nodiscard]] uint32_t rows_of_layer(uint32_t k) const {
    return k <= recent_layers || recent_lead ? info.tokens - recent_tokens : info.tokens;
  }
  /// Layer group g's recent rows reached in a prefix of extent e: at least J, and J
  /// ahead of the other rows when they lead.
  [[nodiscard]] uint32_t recent_layer_of_group(const PrefixExtent& e, uint32_t g) const {
    if (!recent_lead) return std::max(e.layers_of_group(g), recent_layers);
    return recent_layers + std::min(lead_layers(), e.full_layers + (g < e.partial_lead ? 1 : 0));
  }
};

/// Size of the header and tables of a stream of n layers whose recent rows carry
/// `recent_layers` layers in the base (and keep that lead in every layer: `lead`).
size_t layered_header_size(uint32_t layers, const LayeredGrouping& g, uint32_t recent_layers, bool lead);
/// Writes the header at out[at, at + layered_header_size) (reserved by the caller),
/// taking the substream checksums from the bytes that follow it.
void write_layered_header(std::vector<uint8_t>& out, size_t at, LayeredHeader& h);
/// Parses and checks the header and tables from any prefix of a stream that holds
/// them (not the substreams). Errors: corrupt_data, unsupported (another version).
Result<LayeredHeader> parse_layered_header(std::span<const uint8_t> bytes);

/// The extent of a prefix of `size` bytes. Errors: corrupt_data (a prefix shorter than
/// the base layer, or ending inside a substream).
Result<PrefixExtent> prefix_extent(const LayeredHeader& h, uint64_t size);
/// The extent of the prefix that holds the base and the first `refined` substreams
/// after it (no check against the header's substream count).
PrefixExtent extent_after(const LayeredHeader& h, size_t refined);

/// The prefixes of the stream (ChunkPrefix, shortest first).
std::vector<ChunkPrefix> layered_prefixes(const LayeredHeader& h);

/// Low 32 bits of xxh3-64: a substream's checksum.
uint32_t substream_sum(std::span<const uint8_t> bytes);

}  // namespace kvstream::codec

// Baseline KV-cache codecs that the kvstream codec benchmark compares against.
//
// Every baseline really encodes a chunk to bytes and decodes it back; its size is the
// length of the byte string encode() returns, which holds everything a decoder
// needs that is not fixed by the codec's configuration: a header, scales, zero
// points, shipped probability tables and the coded values. Tables learned by
// train() (cachegen-static, cachegen-paper) are part of the codec, not of the
// object, and are not counted (as in the CacheGen paper). docs/baselines.md
// describes each format.
//
// Families (method()) and settings (config()):
//   fp16            "fp16"                  raw IEEE half precision
//   int-token       "int8","int6","int5","int4"   per-token absmax symmetric
//   kivi            "k3v2g64", ... (MLA: "k3g64")  K per-channel, V per-token, asymmetric
//   zstd-fp16       "zstd3","zstd19"        zstd over byte-shuffled fp16
//   cachegen-code   "bins32-16"             LMCache's CacheGen: per-chunk tables shipped
//   cachegen-static "kb16-vb8", ... (MLA: "kb16")  static per-channel tables from train()
//   cachegen-paper  "g10-kb32-16-vb32-16", ... (MLA: "g10-kb32-16")  anchors + deltas
//
// Planes: plane 0 is K, plane 1 is V. An MLA cache has one plane (the latent); it is
// coded with the K settings and the V settings are absent from the config name.
//
// Input values that are not finite are coded as if NaN were 0 and +-inf were
// +-65504 (the fp16 limit), except by fp16 and zstd-fp16, which keep fp16 bits as they are.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvstream/kv_model.hpp"
#include "kvstream/status.hpp"

namespace kvstream::codec::baselines {

/// One baseline at one setting. Immutable after train(); encode/decode are const and
/// may run concurrently from several threads once training is done.
class BaselineCodec {
 public:
  virtual ~BaselineCodec() = default;

  /// The family: "fp16", "int-token", "kivi", "zstd-fp16", "cachegen-code",
  /// "cachegen-static" or "cachegen-paper".
  [[nodiscard]] virtual std::string method() const = 0;

  /// The setting within the family, e.g. "int8", "k3v2g64", "kb16-vb8".
  [[nodiscard]] virtual std::string config() const = 0;

  /// "method/config", a unique name across make_all_baselines().
  [[nodiscard]] std::string name() const { return method() + "/" + config(); }

  /// True when encode() needs train() first (cachegen-static, cachegen-paper).
  [[nodiscard]] virtual bool needs_training() const { return false; }

  /// Learns static statistics from sample chunks (all with one geometry; any token
  /// counts). Only cachegen-static and cachegen-paper use it; for the others it is a
  /// no-op. Training again replaces what was learned. Errors: invalid_argument (no
  /// samples, no tokens at all, mixed or invalid geometries).
  virtual Status train(std::span<const KvView> samples) {
    (void)samples;
    return {};
  }

  /// Encodes one chunk (all layers and planes of chunk.tokens() tokens, any token
  /// count, any layout/dtype) into a self-contained byte string. Errors:
  /// invalid_argument (invalid geometry, more than 2^32-1 tokens, a trained codec
  /// not trained or trained on another geometry, a codec configured without V
  /// settings given a two-plane chunk).
  [[nodiscard]] virtual Result<std::vector<uint8_t>> encode(const KvView& chunk) const = 0;

  /// Decodes `bytes` into `out`, which must have the geometry and token count that
  /// were encoded (any dtype/layout; values are rounded to out's dtype). The bytes
  /// are untrusted: anything malformed yields corrupt_data, never undefined
  /// behaviour. `out` is written only on success. Errors: invalid_argument (out's
  /// geometry or token count differs from the encoded one; untrained codec),
  /// corrupt_data.
  virtual Status decode(std::span<const uint8_t> bytes, const KvView& out) const = 0;
};

// --- Individual baselines -------------------------------------------------------

/// Raw fp16: header + 2 bytes per element.
std::unique_ptr<BaselineCodec> make_fp16();

/// Per-token absmax symmetric quantization to `bits` in [2, 8]: one fp16 absmax per
/// (layer, plane, token); codes in [-(2^(bits-1)-1), 2^(bits-1)-1], bit-packed.
std::unique_ptr<BaselineCodec> make_int_token(int bits);

/// KIVI-style asymmetric quantization. K (plane 0): per channel over groups of
/// `group` consecutive tokens; V (plane 1): per token over groups of `group`
/// consecutive channels (the whole row when group >= channels). An fp16 scale and
/// an fp16 zero point per group. k_bits in [1, 8]; v_bits in [1, 8], or 0 for a
/// single-plane (MLA) configuration. group in [1, 65535].
std::unique_ptr<BaselineCodec> make_kivi(int k_bits, int v_bits, int group);

/// zstd at `level` (1..22) over the fp16 bytes, byte-shuffled (all low bytes, then
/// all high bytes) first.
std::unique_ptr<BaselineCodec> make_zstd_fp16(int level);

/// Bins of one layer and plane under CacheGen's layer grouping: `hi_bins` for the
/// first layers, `lo_bins` for the rest. The published LMCache configuration for
/// 32-layer models gives K layers 0-9 and V layers 0-1 the high bins; for L >= 32
/// layers the same indices (10 and 2) are used, for L < 32 they are scaled to
/// ceil(10 L / 32) and ceil(2 L / 32). A single-plane (MLA) cache uses the K rule.
int cachegen_layer_bins(uint32_t layers, uint32_t layer, uint32_t plane, int hi_bins, int lo_bins) noexcept;

/// CacheGen as in LMCache: per-token absmax quantization with bins by layer group
/// (hi_bins/lo_bins, even, 4..254), integers in [-(bins/2-1), bins/2-1]; a
/// frequency table per (layer, plane, channel) built from the chunk and shipped in
/// it; rANS coding. Config "bins{hi}-{lo}".
std::unique_ptr<BaselineCodec> make_cachegen_code(int hi_bins = 32, int lo_bins = 16);

/// CacheGen quantization with uniform K bins and V bins (even, 4..254; v_bins 0 for
/// single-plane MLA) and static per-(layer, plane, channel) tables learned by
/// train(), clustered to at most `max_tables` (1..256) per (layer, plane).
std::unique_ptr<BaselineCodec> make_cachegen_static(int k_bins, int v_bins, int max_tables = 256);

/// The CacheGen paper's design: groups of `group` tokens (1..255); the first token of
/// each group is an anchor quantized per-token absmax to 255 levels; the others are
/// deltas from the reconstructed anchor, quantized per-token absmax with bins by
/// layer group (k_hi/k_lo for K, v_hi/v_lo for V; v_* 0 for MLA). Static tables per
/// (layer, plane, channel, anchor-or-delta) from train(), at most `max_tables` per
/// coded matrix.
std::unique_ptr<BaselineCodec> make_cachegen_paper(int group, int k_hi, int k_lo, int v_hi, int v_lo,
                                                   int max_tables = 256);

/// Every configuration the benchmark sweeps for geometry `g`, in a stable order:
/// fp16; int8, int6, int5, int4; kivi K bits 2-5 x V bits 1-4 x group {32, 64, 128}
/// (MLA: K bits x group); zstd3, zstd19; cachegen-code bins32-16; cachegen-static
/// K bins {8,12,16,24,32,48,64} x V bins {4,6,8,12,16,24,32} (MLA: K bins);
/// cachegen-paper g10 with bins 32-16 scaled by 0.5, 1, 2.
/// Trained codecs must be trained before use (needs_training()).
std::vector<std::unique_ptr<BaselineCodec>> make_all_baselines(const KvGeometry& g);

}  // namespace kvstream::codec::baselines

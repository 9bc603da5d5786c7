// The KV codec: CacheGen-style encoding of a chunk of tokens into a compact,
// self-checking bitstream at one of several compression levels, and its decoding
// straight into a runtime's KV memory (any layout the KV view describes).
//
// Everything a decoder needs besides the bitstream lives in a Profile, built offline
// from sample KV caches: per (layer, plane, channel) the predictor, mean and step
// weight; per level the step and the static entropy tables; per level its measured
// size and quality. A bitstream names its profile's hash, so decoding with another
// profile is an error rather than garbage.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvstream/kv_model.hpp"
#include "kvstream/status.hpp"

namespace kvstream::codec {

/// How a channel's values are predicted before quantization.
enum class Predictor : uint8_t {
  none = 0,    ///< code the value itself
  mean = 1,    ///< code value - the channel's mean (from the profile)
  anchor = 2,  ///< CacheGen's delta coding: the first token of each group is coded
               ///< against the mean, the others against that anchor's reconstruction
};

/// What the profile recorded about one compression level.
struct LevelInfo {
  float step = 0;                 ///< base quantization step (scaled per channel by its weight)
  double bits_per_element = 0;    ///< measured on the profile's samples, every byte counted
  double ppl_increase_pct = -1;   ///< measured quality (-1: not measured)
  double kl_nats = -1;            ///< mean KL divergence per scored token (-1: not measured)
  /// Progressive profiles: the mean over the profile's samples of the distortion the
  /// encoder measures for this level's prefix (ChunkPrefix::distortion), which
  /// calibrates a chunk's own distortion against this level's measured quality
  /// (-1: not recorded).
  double distortion = -1;
};

/// An immutable, hashed codec profile.
class Profile {
 public:
  Profile();
  ~Profile();
  Profile(Profile&&) noexcept;
  Profile& operator=(Profile&&) noexcept;
  Profile(const Profile&);
  Profile& operator=(const Profile&);

  /// Parses a serialized profile, verifying version, bounds and content hash.
  static Result<Profile> load(std::span<const uint8_t> bytes);
  static Result<Profile> load_file(const std::string& path);
  /// The serialized form (what load() reads back).
  [[nodiscard]] std::vector<uint8_t> serialize() const;
  /// Writes atomically (temporary file, fsync, rename).
  Status save_file(const std::string& path) const;

  /// Content hash (xxh3-64 of the serialized body); bitstreams carry it.
  [[nodiscard]] uint64_t hash() const noexcept;
  [[nodiscard]] const KvGeometry& geometry() const noexcept;
  [[nodiscard]] const RopeParams& rope() const noexcept;
  /// True when K is coded before RoPE (the rotation is undone on encode, redone on decode).
  [[nodiscard]] bool codes_k_before_rope() const noexcept;
  [[nodiscard]] uint32_t group_size() const noexcept;
  [[nodiscard]] uint32_t levels() const noexcept;
  /// True when every chunk is one embedded stream: level i is a prefix of level i - 1
  /// (a base layer at the coarsest level, then refinement layers; docs/bitstream.md).
  [[nodiscard]] bool progressive() const noexcept;
  /// Progressive profiles: a context's last recent_tokens() tokens carry
  /// recent_layers() refinement layers in the base layer of their chunk
  /// (EncodeOptions::recent_tokens); 0 and 0 when the profile has none.
  [[nodiscard]] uint32_t recent_tokens() const noexcept;
  [[nodiscard]] uint32_t recent_layers() const noexcept;
  /// True when those tokens stay recent_layers() layers ahead of the others in every
  /// refinement layer, not only in the base (ProfileOptions::recent_lead).
  [[nodiscard]] bool recent_lead() const noexcept;
  [[nodiscard]] const LevelInfo& level(uint32_t i) const;
  [[nodiscard]] Predictor predictor(uint32_t layer, uint32_t plane, uint32_t channel) const;
  /// Number of channels that use each predictor (index by Predictor value).
  [[nodiscard]] std::vector<uint64_t> predictor_counts() const;

  /// Records a level's measured quality (the content hash changes accordingly). A
  /// progressive profile's `distortion` (>= 0; -1 keeps the builder's) is the mean
  /// ChunkPrefix::distortion of the chunks that quality was measured on: it
  /// calibrates a chunk's own distortion against that quality, so both must come from
  /// the same chunks (a context's last chunk, with recent rows, distorts less).
  /// Errors: out_of_range (level), invalid_argument (distortion negative or not finite).
  Status set_level_quality(uint32_t level, double ppl_increase_pct, double kl_nats, double distortion = -1);

  /// The profile's tables (defined inside the library).
  struct Impl;

 private:
  friend struct ProfileAccess;  // the encoder and decoders read the tables
  explicit Profile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class ProfileBuilder;
};

/// Options of the offline profile build.
struct ProfileOptions {
  uint32_t group_size = 10;          ///< tokens per anchor group
  bool code_k_before_rope = true;    ///< undo RoPE on K before coding (needs the cache's RopeParams)
  /// Base steps, finest first; each level's step per channel is step * weight_scale(channel).
  std::vector<float> level_steps = {0.08f, 0.15f, 0.27f, 0.45f, 0.7f, 1.0f, 1.2f, 1.4f, 1.7f, 2.0f, 2.8f};
  /// Optional sensitivity per (layer, plane, channel), larger = more sensitive; the
  /// step of a channel scales with 1/sqrt(weight). Empty: 1/variance (plain
  /// per-channel normalization).
  std::vector<float> channel_weights;
  /// Optional extra step multiplier per (layer, plane) ([layer][plane]); 1 when empty.
  /// CacheGen's three layer groups with bins 0.5/1/1.5 are expressed here as
  /// multipliers 0.5, 1 and 1.5 on the layers of each group.
  std::vector<float> layer_plane_step;
  /// Which predictors the builder may choose from (it picks per channel the one whose
  /// residuals cost fewest bits at the middle level).
  bool allow_anchor = true;
  bool allow_mean = true;
  /// Static entropy tables per level (<= 256). 32 tables (256 KiB of decode tables)
  /// cost about 1.5% more bits than 128 on stories260K and decode about 10% faster.
  uint32_t max_tables_per_level = 32;
  /// Whether a (layer, plane) may be coded in a decorrelating (KLT) basis; the builder
  /// uses one only where it saves at least `transform_min_gain` of the bits.
  bool allow_transform = true;
  /// Largest KLT block (channels); decode costs about one multiply-add per element per
  /// block channel, so big models keep blocks at a head or less.
  uint32_t max_transform_block = 128;
  /// A KLT costs about one cycle per element at decode (32-channel blocks); on
  /// stories260K requiring a 20% saving keeps it on the K planes of the first layers,
  /// which gives ~10% more bits than using it everywhere and >500M elements/s decode.
  double transform_min_gain = 0.2;
  /// One embedded stream per chunk instead of one stream per level: a base layer
  /// coded at `progressive_base_step`, then `progressive_layers - 1` refinement
  /// layers, each dividing the step by kRefineRatio; level i (0 finest) is the prefix
  /// through layer `progressive_layers - 1 - i`. Replaces `level_steps`. Channels use
  /// the mean or no predictor (the anchor predictor's prediction would change with
  /// the layer, so the layers would not nest).
  bool progressive = false;
  /// Base step 2.8 with the recent window below and kvstream-profile's sensitivity
  /// weights (floor 0.05): on stories260K's held-out windows the base's KL per token
  /// (0.012 nats) is the one that matches a 1% perplexity increase, so the base is
  /// what a 1%-bounded chooser fetches for the first token; three layers above it
  /// refine (the finest, 0.10, is near lossless). Without the recent window the same
  /// KL needs step 1.4 and 1.58 bits per element instead of 1.13. kvstream-profile
  /// builds progressive profiles; the library default stays one stream per level, so
  /// that existing ProfileOptions build the profiles (and hashes) they always did.
  float progressive_base_step = 2.8f;
  uint32_t progressive_layers = 4;
  /// Progressive: a context's last `recent_tokens` tokens are coded with
  /// `recent_layers` refinement layers already in the base (0: none). The tokens just
  /// before a runtime's new ones are those its attention leans on most (KVTC keeps
  /// such a window exact): on stories260K the last 64 of 384 tokens at a third of the
  /// step cut the base's KL per token 5.8x (0.052 to 0.009 nats) for 0.19 bits per
  /// element. Encoders apply it where the
  /// caller says a chunk ends its context (EncodeOptions; KvStore::put does).
  uint32_t recent_tokens = 64;
  uint32_t recent_layers = 1;
  /// Progressive with a recent window: those tokens stay `recent_layers` layers ahead
  /// of the others at every prefix, not only in the base (each refinement layer opens
  /// with their next layer). Every level then holds them finer: on text unlike the
  /// profile's, whose predictions lean harder on them, this is what keeps the first
  /// refinement within a 1%-equivalent KL.
  bool recent_lead = true;
  /// Workers for the build (0: one per hardware thread). The profile is the same,
  /// byte for byte, for any count: each (layer, plane), level and sample is built on
  /// its own and the results are combined in order. Each worker holds about four
  /// copies of one (layer, plane)'s sample values while it fits a KLT, so many
  /// workers over large samples need that much more memory.
  unsigned threads = 0;
};

/// Step ratio between consecutive layers of a progressive stream (part of the format):
/// an odd ratio makes the cells of a round-to-nearest quantizer nest, so a refinement
/// symbol is one of three sub-cells of the coarser one.
inline constexpr uint32_t kRefineRatio = 3;
/// Most layers a progressive profile may have (indices stay within 16 bits).
inline constexpr uint32_t kMaxProgressiveLayers = 6;

/// Builds profiles from sample KV caches.
class ProfileBuilder {
 public:
  /// All samples must share one geometry and RoPE (the first sample's).
  static Result<Profile> build(std::span<const KvView> samples, const RopeParams& rope, const ProfileOptions& opt);
};

/// Tokens per chunk unless a caller says otherwise (CacheGen's default). Any size
/// works; each chunk decodes on its own.
inline constexpr uint32_t kDefaultChunkTokens = 1536;

/// The view-relative token ranges of consecutive chunks of `chunk_tokens` covering
/// `tokens` tokens (the last one may be shorter). Empty when either is 0.
std::vector<TokenRange> chunk_ranges(uint64_t tokens, uint32_t chunk_tokens = kDefaultChunkTokens);

/// What a bitstream's header says (readable without the profile).
struct ChunkInfo {
  KvGeometry geometry;
  DType dtype = DType::f16;     ///< element type of the encoded source
  uint64_t first_position = 0;  ///< position of the chunk's first token
  uint32_t tokens = 0;
  uint32_t level = 0;
  uint64_t profile_hash = 0;
  uint64_t total_bytes = 0;     ///< size of the bytes inspected (a prefix of a progressive stream)
  /// Progressive streams: the whole stream's size and its layer count (1 and
  /// total_bytes for a stream of one level).
  bool progressive = false;
  uint64_t stream_bytes = 0;
  uint32_t coded_layers = 1;
  /// Progressive streams: the chunk's last rows coded finer in the base layer
  /// (EncodeOptions::recent_tokens; 0: none).
  uint32_t recent_tokens = 0;
};

/// A point at which a progressive stream may be cut and still decode: every
/// substream boundary after the base layer. `level` is the level the prefix
/// reaches in full (a prefix inside a layer refines only some layers and planes);
/// `distortion` is the encoder's measurement of what decoding the prefix gives: the
/// mean squared error per element in units of each channel's step scale (the
/// profile's sensitivity weighting), so chunks compare on one scale.
/// `recent_only`: the prefix ends one of a layer's lead substreams (recent rows that
/// lead, ProfileOptions::recent_lead): it refines the chunk's recent rows and nothing
/// else. Only a chunk with recent rows has such prefixes, so a caller that needs the
/// same options for every chunk of a context (policy::ContextCosts) skips them.
struct ChunkPrefix {
  uint64_t end = 0;
  uint32_t level = 0;
  bool whole_layer = false;
  double distortion = 0;
  bool recent_only = false;
  bool operator==(const ChunkPrefix&) const = default;
};

/// Bytes of a progressive stream's header (fixed part and tables), read from its first
/// 64 bytes: a reader fetching prefixes fetches this many first. Errors: corrupt_data,
/// unsupported (a stream of one level).
Result<size_t> chunk_header_bytes(std::span<const uint8_t> first_bytes);

/// The prefixes of a progressive stream, shortest first (the last is the whole
/// stream), from any prefix that holds its header. Errors: corrupt_data, unsupported
/// (a stream of one level).
Result<std::vector<ChunkPrefix>> chunk_prefixes(std::span<const uint8_t> header);

/// Encodes `chunk` (all its tokens, every layer and plane) at `level`, appending the
/// bitstream to `out`. The chunk's geometry must match the profile's; its first
/// position feeds RoPE. With a progressive profile the bitstream is the prefix of the
/// chunk's embedded stream through `level` (level 0: the whole stream), so one
/// encode_chunk at level 0 holds every level. Errors: invalid_argument, out_of_range
/// (level).
Status encode_chunk(const Profile& profile, const KvView& chunk, uint32_t level, std::vector<uint8_t>& out);

/// What an encoder is told about a chunk beyond its KV.
struct EncodeOptions {
  /// The chunk's last `recent_tokens` tokens are among the last tokens of their
  /// context (recent_tokens_of computes it). A progressive profile with recent
  /// layers (Profile::recent_tokens) codes them finer in the base layer: the tokens
  /// just before a runtime's new ones are the ones its attention leans on most.
  /// Ignored by other profiles; at most the chunk's tokens.
  uint32_t recent_tokens = 0;
};

/// How many of `chunk`'s tokens (a range of a context of `context_tokens`) are among
/// the context's last Profile::recent_tokens() tokens: 0 for a profile without recent
/// layers and for every chunk but the context's last one or two.
uint32_t recent_tokens_of(const Profile& profile, TokenRange chunk, uint64_t context_tokens);

/// encode_chunk with options (encode_chunk above is this with EncodeOptions{}).
/// Errors: as above; invalid_argument when options.recent_tokens exceeds the chunk.
Status encode_chunk(const Profile& profile, const KvView& chunk, uint32_t level, const EncodeOptions& options,
                    std::vector<uint8_t>& out);

/// Reads and checks a bitstream's header (magic, version, bounds, header checksum).
Result<ChunkInfo> inspect_chunk(std::span<const uint8_t> bytes);

/// Reusable decode scratch so steady-state decoding does not allocate.
class DecodeScratch {
 public:
  DecodeScratch();
  ~DecodeScratch();
  DecodeScratch(DecodeScratch&&) noexcept;
  DecodeScratch& operator=(DecodeScratch&&) noexcept;
  /// The scratch buffers (defined inside the library).
  struct Impl;

 private:
  friend struct ScratchAccess;  // the decoders use the buffers
  std::unique_ptr<Impl> impl_;
};

/// Decodes a bitstream into `out`, which must have the chunk's geometry and token
/// count (any dtype and layout, packed or paged). Checks the profile hash and the
/// payload checksum before touching `out`; on error `out` may be partly written only
/// for errors found after the checksum passed (none are expected). Errors:
/// corrupt_data, invalid_argument (profile or view mismatch).
Status decode_chunk(const Profile& profile, std::span<const uint8_t> bytes, const KvView& out,
                    DecodeScratch* scratch = nullptr);

/// Upgrades KV decoded from `kept` (a prefix of a progressive stream) in place to the
/// longer prefix `kept` + `more`, where `more` starts at a substream boundary (the end
/// of `kept`): what a runtime does after its first token with the bytes from one
/// level's end to a finer one's. The result is bit for bit what decode_chunk gives on
/// the longer prefix (it is that decode, reading the two spans without joining them).
/// Errors: as decode_chunk; invalid_argument when `kept` is not a progressive prefix.
Status refine_chunk(const Profile& profile, std::span<const uint8_t> kept, std::span<const uint8_t> more,
                    const KvView& out, DecodeScratch* scratch = nullptr);

/// Decodes with `threads` workers sharing the (layer, plane) substreams.
Status decode_chunk_parallel(const Profile& profile, std::span<const uint8_t> bytes, const KvView& out,
                             unsigned threads);

}  // namespace kvstream::codec

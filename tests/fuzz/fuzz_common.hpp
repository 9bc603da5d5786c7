// Shared by the kvstream codec fuzz targets and their seed generator: fixed codec
// profiles built from deterministic synthetic KV, the input framing (one control byte,
// then the bytes under test), and the "reseal" step that rewrites checksums so that
// mutated inputs reach the parsers behind them.
//
// The synthetic data uses integer arithmetic only (values are small integers / 16,
// exact in every dtype's float), and the profile builder is deterministic, so the
// fuzz targets and fuzz_seed_gen rebuild bit-identical profiles (same hashes) from
// the same instrumented library.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

#include <xxhash.h>

#include "kvstream/codec.hpp"
#include "kvstream/kv_model.hpp"
#include "kvstream/log.hpp"

namespace kvstream::fuzz {

struct ProfileSpec {
  KvGeometry geom;
  RopeParams rope;
  std::vector<float> steps;
  uint32_t group_size;
  uint32_t max_tables;
  bool allow_anchor;
  /// One embedded stream per chunk (ProfileOptions::progressive, kProgressiveLayers
  /// layers at the default base step; `steps` unused).
  bool progressive = false;
};

inline constexpr uint32_t kProgressiveLayers = 3;

inline const std::vector<ProfileSpec>& profile_specs() {
  static const std::vector<ProfileSpec> s = {
      // GQA with RoPE (K coded before RoPE), anchors allowed.
      {{2, 2, 16, 4, AttentionKind::gqa}, {true, 10000.0f, 0, RopePairing::interleaved}, {0.05f, 0.3f, 1.0f}, 10, 8, true},
      // MLA latent, one plane, small groups.
      {{1, 1, 32, 8, AttentionKind::mla}, {}, {0.1f, 0.8f}, 4, 4, true},
      // MHA, half-pairing partial RoPE, no anchors.
      {{1, 2, 8, 2, AttentionKind::mha}, {true, 500000.0f, 4, RopePairing::half}, {0.02f, 0.5f}, 6, 2, false},
      // Progressive, 3 layers: GQA with RoPE, 8 layers of one 8-wide KV head, so 16
      // (layer, plane) substreams per layer and 8 channels per token. A chunk of
      // kProgressiveGroupedTokens tokens has two plane groups per refinement layer (prefixes
      // that end inside a layer); shorter chunks have one.
      {{8, 1, 8, 2, AttentionKind::gqa}, {true, 10000.0f, 0, RopePairing::interleaved}, {}, 10, 4, false, true},
  };
  return s;
}

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Correlated, integer-valued (/16) KV; K rotated with RoPE at its positions.
inline KvCache synthetic_cache(const KvGeometry& g, const RopeParams& rope, DType dt, uint64_t tokens,
                               uint64_t first_position, uint64_t seed) {
  KvCache cache = KvCache::create(g, dt, tokens, first_position).value();
  const uint32_t C = g.channels();
  std::vector<float> row(C);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p) {
      int64_t walk[3] = {0, 0, 0};
      uint64_t s = mix64(seed * 1000003 + l * 31 + p);
      for (uint64_t t = 0; t < tokens; ++t) {
        for (int64_t& w : walk) {
          s = mix64(s);
          w = (w * 7) / 8 + int64_t(s % 9) - 4;
        }
        for (uint32_t c = 0; c < C; ++c) {
          s = mix64(s);
          const int64_t off = int64_t(mix64(l * 131 + p * 17 + c) % 64) - 32;
          const int64_t v = off + walk[c % 3] * int64_t(1 + c % 4) - walk[(c + 1) % 3] + int64_t(s % 7) - 3;
          row[c] = float(v) / 16.0f;
        }
        if (p == 0 && rope.enabled && g.kind != AttentionKind::mla)
          for (uint32_t h = 0; h < g.kv_heads; ++h)
            rope_rotate(&row[size_t(h) * g.head_dim], g.head_dim, int64_t(first_position + t), rope, false);
        for (uint32_t c = 0; c < C; ++c) cache.set(l, p, t, c, row[c]);
      }
    }
  cache.set_rope(rope);
  return cache;
}

inline std::vector<codec::Profile> build_profiles() {
  set_log_level(LogLevel::off);
  std::vector<codec::Profile> out;
  for (size_t i = 0; i < profile_specs().size(); ++i) {
    const ProfileSpec& ps = profile_specs()[i];
    const KvCache a = synthetic_cache(ps.geom, ps.rope, DType::f32, 48, 0, 2 * i + 1);
    const KvCache b = synthetic_cache(ps.geom, ps.rope, DType::f32, 31, 200, 2 * i + 2);
    const KvView views[2] = {a.view(), b.view()};
    codec::ProfileOptions opt;
    opt.level_steps = ps.steps;
    opt.group_size = ps.group_size;
    opt.max_tables_per_level = ps.max_tables;
    opt.allow_anchor = ps.allow_anchor;
    if (ps.progressive) {
      opt.progressive = true;
      opt.progressive_layers = kProgressiveLayers;
    }
    auto p = codec::ProfileBuilder::build(views, ps.rope, opt);
    if (!p.ok()) {
      std::fprintf(stderr, "fuzz: profile %zu: %s\n", i, p.status().to_string().c_str());
      std::abort();
    }
    out.push_back(std::move(p).value());
  }
  return out;
}

// ---- Chunk input framing ---------------------------------------------------------------
// byte 0: bits 0-1 profile (mod count), bit 2 reseal checksums, bits 3-4 output dtype
// (mod 3), bit 5 paged output, bit 6 also decode in parallel, bit 7 reuse a scratch.
enum : uint8_t { kReseal = 1u << 2, kPaged = 1u << 5, kParallel = 1u << 6, kScratch = 1u << 7 };

// Chunk header layout, mirrored from codec/bitstream.cpp: payload checksum at 48,
// header checksum at 56 over bytes [0, 56) and the u32 length table after the 64-byte
// fixed header. If the codec's layout changes, chunk_reseal_works() turns false and
// the target fuzzes without resealing (shallower, still memory-checked).
inline constexpr size_t kHdr = 64, kOffPayloadSum = 48, kOffHeaderSum = 56;

inline void chunk_reseal(std::vector<uint8_t>& b, uint32_t substreams) {
  const size_t payload = kHdr + size_t(substreams) * 4;
  if (b.size() < payload) return;
  const uint64_t psum = XXH3_64bits(b.data() + payload, b.size() - payload);
  std::memcpy(b.data() + kOffPayloadSum, &psum, 8);
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, b.data(), kOffHeaderSum);
  XXH3_64bits_update(st, b.data() + kHdr, size_t(substreams) * 4);
  const uint64_t hsum = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  std::memcpy(b.data() + kOffHeaderSum, &hsum, 8);
}

// ---- Progressive (version 2) streams ---------------------------------------------------
// For the progressive profile the control byte is followed by two u16 selectors
// (little-endian): the prefix length under test ("cut", taken from the input) and the
// refine_chunk split point ("split", taken from that prefix), then the stream bytes.
// A selector's top two bits pick how (select_length below): 0 the whole span (for
// split: no refine_chunk), 1 a prefix point of the stream (index = low 14 bits mod
// their count; the whole span when the header does not parse), 2 low bits mod
// (size + 1), 3 size minus that.
inline constexpr size_t kSelectorBytes = 4;
/// Tokens of the seed chunk with two plane groups per refinement layer (see
/// profile_specs(): 600 x 8 channels, so 14 of the 16 planes make 65,536 symbols).
inline constexpr uint64_t kProgressiveGroupedTokens = 600;

inline size_t select_length(uint16_t sel, size_t size, std::span<const codec::ChunkPrefix> points) {
  const size_t v = sel & 0x3fffu;
  switch (sel >> 14) {
    case 0: return size;
    case 1: {
      size_t n = 0;
      while (n < points.size() && points[n].end <= size) ++n;
      return n == 0 ? size : size_t(points[v % n].end);
    }
    case 2: return v % (size + 1);
    default: return size - v % (size + 1);
  }
}

// Layout mirrored from codec/layered_format.cpp (docs/bitstream.md "Progressive
// streams"): stream bytes at 48, header checksum at 56 (xxh3-64 of bytes [0, 56) and
// [64, header_bytes)), then (when flag bits 1-3 hold J > 0) the u32 recent row count,
// then per substream u32 length and u32 low half of its xxh3-64, then one f32
// distortion per prefix point. With S = layers x planes base substreams, n layers and
// G groups, E = S + (J + n - 1 + L) G substreams and P = 1 + (n - 1 + L) G points, where
// L = n - 1 - J when flag bit 4 says the recent rows lead (else 0): the table
// sizes follow from chunk_header_bytes() and the geometry. If that layout changes, the
// decoder target's check at start-up (reseal of a genuine stream) reports
// "progressive reseal OFF" and it fuzzes v2 streams without resealing.
inline constexpr size_t kOffStreamBytes = 48;

inline bool is_progressive_bytes(std::span<const uint8_t> b) {
  return b.size() >= 6 && std::memcmp(b.data(), "KVSC", 4) == 0 && b[4] == 2 && b[5] == 0;
}

/// The header size, where the substream table starts and the substream count of a
/// version-2 header (0s when it does not parse that far or the bytes do not hold it).
struct ProgressiveTables {
  size_t header_bytes = 0;
  size_t table = 0;
  uint64_t substreams = 0;
};
inline ProgressiveTables progressive_tables(std::span<const uint8_t> b) {
  const auto hb = codec::chunk_header_bytes(b);
  if (!hb.ok() || b.size() < *hb) return {};
  const size_t H = *hb;
  uint32_t layers;
  std::memcpy(&layers, b.data() + 8, 4);
  const uint64_t S = uint64_t(layers) * (b[24] >= uint8_t(AttentionKind::mla) ? 1 : 2);
  const uint64_t n = b[7], J = (b[25] >> 1) & 7;
  // Flag bit 4 with J > 0: the recent rows lead, so each of the first n - 1 - J
  // refinement layers also carries G lead substreams and G prefix points.
  const uint64_t L = (b[25] & 16) && J > 0 && n > J ? n - 1 - J : 0;
  const size_t table = kHdr + (J ? 4 : 0);
  if (n < 1 || H < table + 8 * S + 4) return {};
  const uint64_t rest = H - table - 8 * S - 4, per_group = 8 * (J + n - 1 + L) + 4 * (n - 1 + L);
  if (per_group == 0 ? rest != 0 : rest % per_group != 0) return {};
  const uint64_t G = per_group ? rest / per_group : 0;
  return {H, table, S + (J + n - 1 + L) * G};
}

/// Rewrites the checksum of every substream the bytes hold whole, the stream size
/// (to the sum of the table's lengths, so mutated lengths pass that check) and the
/// header checksum.
inline void progressive_reseal(std::vector<uint8_t>& b) {
  const ProgressiveTables t = progressive_tables(b);
  if (t.header_bytes == 0) return;
  const size_t H = t.header_bytes;
  const uint64_t E = t.substreams;
  uint64_t off = H;
  for (uint64_t i = 0; i < E; ++i) {
    uint32_t len;
    std::memcpy(&len, b.data() + t.table + 8 * i, 4);
    if (off + len <= b.size()) {
      const uint32_t sum = uint32_t(XXH3_64bits(b.data() + off, len));
      std::memcpy(b.data() + t.table + 8 * i + 4, &sum, 4);
    }
    off += len;
  }
  std::memcpy(b.data() + kOffStreamBytes, &off, 8);
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, b.data(), kOffHeaderSum);
  XXH3_64bits_update(st, b.data() + kHdr, H - kHdr);
  const uint64_t hsum = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  std::memcpy(b.data() + kOffHeaderSum, &hsum, 8);
}

// ---- Profile input framing ---------------------------------------------------------------
// byte 0: bit 0 reseal (rewrite body size and content hash), bit 1 exercise the
// loaded profile (encode + decode a tiny chunk).
// Serialized profile: "KVSP", u32 version, u64 hash of the body, u64 body size, body.
inline constexpr size_t kProfileHead = 24;

inline void profile_reseal(std::vector<uint8_t>& b) {
  if (b.size() < kProfileHead) return;
  const uint64_t n = b.size() - kProfileHead;
  std::memcpy(b.data() + 16, &n, 8);
  const uint64_t h = XXH3_64bits(b.data() + kProfileHead, n);
  std::memcpy(b.data() + 8, &h, 8);
}

}  // namespace kvstream::fuzz

#include "codec/layered_format.hpp"

#include <cmath>
#include <cstring>

#include <xxhash.h>

#include "codec/byte_io.hpp"

namespace kvstream::codec {

namespace {
constexpr size_t kLayeredOffStreamBytes = 48, kLayeredOffHeaderSum = 56;

size_t points_of(uint32_t layers, const LayeredGrouping& g, uint32_t recent_layers, bool lead) {
  return 1 + size_t(layers - 1 + lead_layers_of(layers, recent_layers, lead)) * g.groups;
}
size_t subs_of(uint32_t layers, const LayeredGrouping& g, uint32_t recent_layers, bool lead) {
  return g.planes + size_t(layers - 1 + recent_layers + lead_layers_of(layers, recent_layers, lead)) * g.groups;
}
// Bytes between the fixed header and the substream table: the recent token count.
size_t recent_field_of(uint32_t recent_layers) { return recent_layers ? 4 : 0; }

uint64_t header_sum(const uint8_t* base, size_t header_bytes) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, base, kLayeredOffHeaderSum);
  XXH3_64bits_update(st, base + kChunkHeaderBytes, header_bytes - kChunkHeaderBytes);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}
}  // namespace

uint32_t substream_sum(std::span<const uint8_t> bytes) { return uint32_t(XXH3_64bits(bytes.data(), bytes.size())); }

LayeredGrouping layered_grouping(const KvGeometry& g, uint32_t tokens) {
  LayeredGrouping r;
  r.planes = g.layers * g.planes();
  const uint64_t per_plane = std::max<uint64_t>(1, uint64_t(tokens) * g.channels());
  const uint64_t want = (kMinGroupSymbols + per_plane - 1) / per_plane;
  r.planes_per_group = uint32_t(std::clamp<uint64_t>(want, 1, std::max<uint32_t>(r.planes, 1)));
  r.groups = (r.planes + r.planes_per_group - 1) / r.planes_per_group;
  return r;
}

size_t layered_header_size(uint32_t layers, const LayeredGrouping& g, uint32_t recent_layers, bool lead) {
  return kChunkHeaderBytes + recent_field_of(recent_layers) + 8 * subs_of(layers, g, recent_layers, lead) +
         4 * points_of(layers, g, recent_layers, lead);
}

void write_layered_header(std::vector<uint8_t>& out, size_t at, LayeredHeader& h) {
  const size_t hb = layered_header_size(h.layers, h.grouping, h.recent_layers, h.recent_lead);
  h.flags = uint8_t((h.flags & kFlagKBeforeRope) | (h.recent_layers << kRecentLayersShift) |
                    (h.recent_lead ? kFlagRecentLead : 0));
  h.header_bytes = hb;
  h.sub_sum.resize(h.sub_bytes.size());
  uint64_t off = at + hb;
  for (size_t i = 0; i < h.sub_bytes.size(); ++i) {
    h.sub_sum[i] = substream_sum({out.data() + off, h.sub_bytes[i]});
    off += h.sub_bytes[i];
  }
  std::vector<uint8_t> head;
  ByteWriter w(head);
  write_shared_header(w, kLayeredVersion, {h.info, uint8_t(h.layers), h.flags, h.group_size});
  w.put(uint64_t(off - at));                                                // 48: the whole stream
  w.put(uint64_t(0));                                                       // 56: header sum, below
  if (h.recent_layers) w.put(h.recent_tokens);                              // 64
  for (size_t i = 0; i < h.sub_bytes.size(); ++i) w.put(h.sub_bytes[i]), w.put(h.sub_sum[i]);
  for (float d : h.distortion) w.put(d);
  std::memcpy(out.data() + at, head.data(), hb);
  const uint64_t hs = header_sum(out.data() + at, hb);
  std::memcpy(out.data() + at + kLayeredOffHeaderSum, &hs, 8);
}

Result<LayeredHeader> parse_layered_header(std::span<const uint8_t> bytes) {
  ByteReader r(bytes, "chunk header");
  KVS_ASSIGN_OR_RETURN(const uint16_t version, read_chunk_version(bytes, r));
  LayeredHeader h;
  if (version != kLayeredVersion)
    return make_status(StatusCode::unsupported, "chunk bitstream version {} is not a progressive stream (version {})",
                       version, kLayeredVersion);
  KVS_ASSIGN_OR_RETURN(const SharedHeader sh, read_shared_header(r));
  h.info = sh.info;
  h.layers = sh.byte7;
  h.flags = sh.flags;
  h.group_size = sh.group_size;
  const uint64_t stream_bytes = r.get<uint64_t>();
  const uint64_t hsum = r.get<uint64_t>();
  KVS_RETURN_IF_ERROR(r.status());
  if (h.layers < 1 || h.layers > kMaxProgressiveLayers)
    return make_status(StatusCode::corrupt_data, "chunk header: {} layers (1..{})", h.layers, kMaxProgressiveLayers);
  if (h.flags & ~(kFlagKBeforeRope | (kRecentLayersMask << kRecentLayersShift) | kFlagRecentLead))
    return make_status(StatusCode::corrupt_data, "chunk header: unknown flags {:#x}", h.flags);
  h.recent_layers = (h.flags >> kRecentLayersShift) & kRecentLayersMask;
  h.recent_lead = (h.flags & kFlagRecentLead) != 0;
  if (h.recent_layers >= h.layers)
    return make_status(StatusCode::corrupt_data, "chunk header: recent rows carry {} layers of {}", h.recent_layers,
                       h.layers);
  if (h.recent_lead && h.recent_layers == 0)
    return make_status(StatusCode::corrupt_data, "chunk header: recent rows lead without recent layers");
  const KvGeometry& g = h.info.geometry;
  h.grouping = layered_grouping(g, h.info.tokens);
  h.header_bytes = layered_header_size(h.layers, h.grouping, h.recent_layers, h.recent_lead);
  if (bytes.size() < h.header_bytes)
    return make_status(StatusCode::corrupt_data, "chunk bitstream of {} bytes is truncated inside its {}-byte header",
                       bytes.size(), h.header_bytes);
  if (header_sum(bytes.data(), h.header_bytes) != hsum)
    return make_status(StatusCode::corrupt_data, "chunk header checksum mismatch");
  const size_t n = subs_of(h.layers, h.grouping, h.recent_layers, h.recent_lead);
  ByteReader t(bytes.subspan(kChunkHeaderBytes, h.header_bytes - kChunkHeaderBytes), "chunk tables");
  if (h.recent_layers) {
    h.recent_tokens = t.get<uint32_t>();
    if (h.recent_tokens == 0 || h.recent_tokens > h.info.tokens)
      return make_status(StatusCode::corrupt_data, "chunk header: {} recent rows of {}", h.recent_tokens,
                         h.info.tokens);
  }
  h.sub_bytes.resize(n), h.sub_sum.resize(n), h.sub_offset.resize(n);
  uint64_t off = h.header_bytes;
  for (size_t i = 0; i < n; ++i) {
    h.sub_bytes[i] = t.get<uint32_t>(), h.sub_sum[i] = t.get<uint32_t>();
    // Every substream holds at least a coded matrix's header, so two prefix points
    // never share an end.
    if (t.ok() && h.sub_bytes[i] == 0) return make_status(StatusCode::corrupt_data, "chunk header: substream {} is empty", i);
    h.sub_offset[i] = off;
    off += h.sub_bytes[i];
  }
  h.distortion.resize(points_of(h.layers, h.grouping, h.recent_layers, h.recent_lead));
  for (float& d : h.distortion) {
    d = t.get<float>();
    if (!(d >= 0.0f) || !std::isfinite(d)) return make_status(StatusCode::corrupt_data, "chunk header: bad distortion");
  }
  KVS_RETURN_IF_ERROR(t.status());
  if (off != stream_bytes || off > kMaxChunkBytes)
    return make_status(StatusCode::corrupt_data, "chunk header: substreams add up to {} bytes, the stream is {}", off,
                       stream_bytes);
  h.info.total_bytes = stream_bytes;
  h.info.progressive = true;
  h.info.stream_bytes = stream_bytes;
  h.info.coded_layers = h.layers;
  h.info.recent_tokens = h.recent_tokens;
  return h;
}

Result<PrefixExtent> prefix_extent(const LayeredHeader& h, uint64_t size) {
  const size_t S = h.base_substreams();
  const uint64_t base_end = h.sub_offset[S - 1] + h.sub_bytes[S - 1];
  if (size < base_end)
    return make_status(StatusCode::corrupt_data, "progressive chunk prefix of {} bytes is shorter than its base layer ({})",
                       size, base_end);
  if (size > h.info.stream_bytes)
    return make_status(StatusCode::corrupt_data, "{} bytes for a progressive chunk of {}", size, h.info.stream_bytes);
  size_t present = S;
  while (present < h.substreams() && h.sub_offset[present] + h.sub_bytes[present] <= size) ++present;
  const uint64_t end = present < h.substreams() ? h.sub_offset[present] : h.info.stream_bytes;
  if (end != size)
    return make_status(StatusCode::corrupt_data, "progressive chunk prefix of {} bytes ends inside substream {}", size,
                       present);
  return extent_after(h, present - S);
}

PrefixExtent extent_after(const LayeredHeader& h, size_t refined) {
  PrefixExtent e;
  e.substreams = h.base_substreams() + refined;
  const uint32_t G = h.grouping.groups;
  // Whole layers first, then what the next one holds: its lead substreams, its groups.
  for (uint32_t k = 1; k < h.layers && refined >= h.layer_substreams(k); ++k)
    refined -= h.layer_substreams(k), ++e.full_layers;
  const uint32_t leads = e.full_layers + 1 <= h.lead_layers() ? G : 0;
  e.partial_lead = uint32_t(std::min<size_t>(refined, leads));
  e.partial_groups = uint32_t(refined - e.partial_lead);
  return e;
}

std::vector<ChunkPrefix> layered_prefixes(const LayeredHeader& h) {
  std::vector<ChunkPrefix> out;
  const size_t S = h.base_substreams();
  for (size_t i = S - 1; i < h.substreams(); ++i) {
    const size_t refined = i + 1 - S;
    const PrefixExtent e = extent_after(h, refined);
    ChunkPrefix p;
    p.end = h.sub_offset[i] + h.sub_bytes[i];
    p.level = h.layers - 1 - e.full_layers;
    p.whole_layer = e.partial_lead == 0 && e.partial_groups == 0;
    p.recent_only = e.partial_lead > 0 && e.partial_groups == 0;
    p.distortion = h.distortion[refined];
    out.push_back(p);
  }
  return out;
}

Result<size_t> chunk_header_bytes(std::span<const uint8_t> first_bytes) {
  if (first_bytes.size() < kChunkHeaderBytes)
    return make_status(StatusCode::corrupt_data, "need the first {} bytes of a chunk, have {}", kChunkHeaderBytes,
                       first_bytes.size());
  uint16_t version;
  std::memcpy(&version, first_bytes.data() + 4, 2);
  if (std::memcmp(first_bytes.data(), kChunkMagic, 4) != 0)
    return make_status(StatusCode::corrupt_data, "not a kvstream chunk bitstream (bad magic)");
  if (version != kLayeredVersion)
    return make_status(StatusCode::unsupported, "chunk bitstream version {} is not a progressive stream", version);
  KvGeometry g;
  ByteReader r(first_bytes.subspan(8), "chunk header");
  g.layers = r.get<uint32_t>(), g.kv_heads = r.get<uint32_t>(), g.head_dim = r.get<uint32_t>();
  g.q_heads = r.get<uint32_t>();
  g.kind = AttentionKind(std::min<uint8_t>(r.get<uint8_t>(), uint8_t(AttentionKind::mla)));
  r.skip(3);
  const uint32_t tokens = r.get<uint32_t>();
  const uint32_t layers = first_bytes[7];
  const uint32_t recent_layers = (first_bytes[25] >> kRecentLayersShift) & kRecentLayersMask;
  const bool lead = (first_bytes[25] & kFlagRecentLead) != 0 && recent_layers > 0;
  if (Status st = g.validate(); !st.ok()) return make_status(StatusCode::corrupt_data, "chunk header: {}", st.message());
  if (tokens == 0 || tokens > kMaxChunkTokens || layers < 1 || layers > kMaxProgressiveLayers)
    return make_status(StatusCode::corrupt_data, "chunk header: {} tokens, {} layers", tokens, layers);
  if (recent_layers >= layers)
    return make_status(StatusCode::corrupt_data, "chunk header: recent rows carry {} layers of {}", recent_layers,
                       layers);
  return layered_header_size(layers, layered_grouping(g, tokens), recent_layers, lead);
}

Result<std::vector<ChunkPrefix>> chunk_prefixes(std::span<const uint8_t> header) {
  KVS_ASSIGN_OR_RETURN(LayeredHeader h, parse_layered_header(header));
  return layered_prefixes(h);
}

}  // namespace kvstream::codec

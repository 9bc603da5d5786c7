#include "codec/bitstream.hpp"

#include <cstring>

#include <xxhash.h>

#include "codec/byte_io.hpp"
#include "codec/layered_codec.hpp"
#include "codec/layered_format.hpp"
#include "codec/profile_impl.hpp"
#include "codec/impl_access.hpp"

namespace kvstream::codec {

namespace {
// Offsets inside the fixed header.
constexpr size_t kOffPayloadSum = 48, kOffHeaderSum = 56;

uint64_t header_sum(const uint8_t* base, uint32_t substreams) {
  // Covers the fixed header except the checksum field itself, and the length table.
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, base, kOffHeaderSum);
  XXH3_64bits_update(st, base + kChunkHeaderBytes, size_t(substreams) * 4);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}
}  // namespace

Result<uint16_t> read_chunk_version(std::span<const uint8_t> bytes, ByteReader& r) {
  if (bytes.size() < kChunkHeaderBytes)
    return make_status(StatusCode::corrupt_data, "chunk bitstream of {} bytes is shorter than its {}-byte header",
                       bytes.size(), kChunkHeaderBytes);
  if (std::memcmp(bytes.data(), kChunkMagic, 4) != 0)
    return make_status(StatusCode::corrupt_data, "not a kvstream chunk bitstream (bad magic)");
  r.skip(4);
  return r.get<uint16_t>();
}

Result<SharedHeader> read_shared_header(ByteReader& r) {
  SharedHeader h;
  const uint8_t dtype = r.get<uint8_t>();
  h.byte7 = r.get<uint8_t>();
  KvGeometry& g = h.info.geometry;
  g.layers = r.get<uint32_t>(), g.kv_heads = r.get<uint32_t>(), g.head_dim = r.get<uint32_t>();
  g.q_heads = r.get<uint32_t>();
  const uint8_t kind = r.get<uint8_t>();
  h.flags = r.get<uint8_t>();
  h.group_size = r.get<uint16_t>();
  h.info.tokens = r.get<uint32_t>();
  h.info.first_position = r.get<uint64_t>();
  h.info.profile_hash = r.get<uint64_t>();
  KVS_RETURN_IF_ERROR(r.status());
  if (dtype > uint8_t(DType::bf16)) return make_status(StatusCode::corrupt_data, "chunk header: element type {}", dtype);
  if (kind > uint8_t(AttentionKind::mla))
    return make_status(StatusCode::corrupt_data, "chunk header: attention kind {}", kind);
  h.info.dtype = DType(dtype);
  g.kind = AttentionKind(kind);
  // A geometry no model has is corrupt input here, whatever validate() calls it.
  if (Status st = g.validate(); !st.ok())
    return make_status(StatusCode::corrupt_data, "chunk header: {}", st.message());
  if (h.info.tokens == 0 || h.info.tokens > kMaxChunkTokens)
    return make_status(StatusCode::corrupt_data, "chunk header: {} tokens (limit {})", h.info.tokens, kMaxChunkTokens);
  return h;
}

void write_shared_header(ByteWriter& w, uint16_t version, const SharedHeader& h) {
  for (char c : kChunkMagic) w.put(uint8_t(c));
  w.put(version);                                             // 4
  w.put(uint8_t(h.info.dtype)), w.put(h.byte7);               // 6, 7
  const KvGeometry& g = h.info.geometry;
  w.put(g.layers), w.put(g.kv_heads), w.put(g.head_dim), w.put(g.q_heads);  // 8..24
  w.put(uint8_t(g.kind)), w.put(h.flags), w.put(h.group_size);              // 24..28
  w.put(h.info.tokens);                                                     // 28
  w.put(h.info.first_position);                                             // 32
  w.put(h.info.profile_hash);                                               // 40
}

void begin_header(std::vector<uint8_t>& out, size_t at, uint32_t substreams) {
  out.resize(at + kChunkHeaderBytes + size_t(substreams) * 4, 0);
}

void finish_header(std::vector<uint8_t>& out, size_t at, const ChunkHeader& h) {
  std::vector<uint8_t> head;
  ByteWriter w(head);
  write_shared_header(w, kChunkVersion, {h.info, uint8_t(h.info.level), h.flags, h.group_size});
  w.put(uint64_t(0)), w.put(uint64_t(0));                                   // 48: sums, filled below
  std::memcpy(out.data() + at, head.data(), kChunkHeaderBytes);
  const size_t n = h.substream_bytes.size();
  std::memcpy(out.data() + at + kChunkHeaderBytes, h.substream_bytes.data(), n * 4);
  const size_t payload = at + kChunkHeaderBytes + n * 4;
  const uint64_t psum = XXH3_64bits(out.data() + payload, out.size() - payload);
  std::memcpy(out.data() + at + kOffPayloadSum, &psum, 8);
  const uint64_t hsum = header_sum(out.data() + at, uint32_t(n));
  std::memcpy(out.data() + at + kOffHeaderSum, &hsum, 8);
}

Result<ChunkHeader> parse_header(std::span<const uint8_t> bytes, size_t* payload_offset) {
  ByteReader r(bytes, "chunk header");
  KVS_ASSIGN_OR_RETURN(const uint16_t version, read_chunk_version(bytes, r));
  ChunkHeader h;
  if (version != kChunkVersion)
    return make_status(StatusCode::unsupported, "chunk bitstream version {} (this decoder reads version {}{})", version,
                       kChunkVersion, version == 2 ? "; version 2 is a progressive stream" : "");
  KVS_ASSIGN_OR_RETURN(const SharedHeader sh, read_shared_header(r));
  h.info = sh.info;
  h.info.level = sh.byte7;
  h.flags = sh.flags;
  h.group_size = sh.group_size;
  r.get<uint64_t>();
  const uint64_t hsum = r.get<uint64_t>();
  KVS_RETURN_IF_ERROR(r.status());
  const KvGeometry& g = h.info.geometry;
  const uint64_t n = uint64_t(g.layers) * g.planes();
  if (bytes.size() < kChunkHeaderBytes + n * 4)
    return make_status(StatusCode::corrupt_data, "chunk bitstream truncated inside its length table");
  if (header_sum(bytes.data(), uint32_t(n)) != hsum)
    return make_status(StatusCode::corrupt_data, "chunk header checksum mismatch");
  h.substream_bytes.resize(n);
  std::memcpy(h.substream_bytes.data(), bytes.data() + kChunkHeaderBytes, n * 4);
  uint64_t total = kChunkHeaderBytes + n * 4;
  for (uint32_t s : h.substream_bytes) total += s;
  if (total > kMaxChunkBytes) return make_status(StatusCode::corrupt_data, "chunk bitstream claims {} bytes", total);
  if (total > bytes.size())
    return make_status(StatusCode::corrupt_data, "chunk bitstream truncated: {} of {} bytes", bytes.size(), total);
  if (total < bytes.size())
    return make_status(StatusCode::corrupt_data, "chunk bitstream has {} trailing bytes", bytes.size() - total);
  h.info.total_bytes = total;
  *payload_offset = kChunkHeaderBytes + n * 4;
  return h;
}

Result<ChunkHeader> parse_header_for(const Profile& profile, std::span<const uint8_t> bytes, size_t* payload_offset) {
  const Profile::Impl& p = ProfileAccess::of(profile);
  KVS_ASSIGN_OR_RETURN(ChunkHeader h, parse_header(bytes, payload_offset));
  if (h.info.profile_hash != p.hash)
    return make_status(StatusCode::invalid_argument,
                       "chunk was encoded with codec profile {:016x}, not with this one ({:016x})",
                       h.info.profile_hash, p.hash);
  if (!(h.info.geometry == p.geom) || h.group_size != p.group_size || (h.flags & 1) != uint8_t(p.k_before_rope))
    return make_status(StatusCode::corrupt_data, "chunk header disagrees with its own profile");
  if (h.info.level >= p.levels.size())
    return make_status(StatusCode::corrupt_data, "chunk level {} of a {}-level profile", h.info.level, p.levels.size());
  return h;
}

Status verify_payload(std::span<const uint8_t> bytes, size_t payload_offset) {
  uint64_t want;
  std::memcpy(&want, bytes.data() + kOffPayloadSum, 8);
  if (XXH3_64bits(bytes.data() + payload_offset, bytes.size() - payload_offset) != want)
    return make_status(StatusCode::corrupt_data, "chunk payload checksum mismatch");
  return {};
}

Result<ChunkInfo> inspect_chunk(std::span<const uint8_t> bytes) {
  if (is_layered(bytes)) {
    KVS_ASSIGN_OR_RETURN(LayeredHeader h, parse_layered_header(bytes));
    KVS_ASSIGN_OR_RETURN(const PrefixExtent e, prefix_extent(h, bytes.size()));
    h.info.level = h.layers - 1 - e.full_layers;
    h.info.total_bytes = bytes.size();
    return h.info;
  }
  size_t off = 0;
  KVS_ASSIGN_OR_RETURN(ChunkHeader h, parse_header(bytes, &off));
  return h.info;
}

}  // namespace kvstream::codec

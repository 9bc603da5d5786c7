// Chunk decoder (CPU). The (layer, plane) matrices of a chunk are taken in groups:
// each matrix's side lists are parsed, the group's symbol streams are entropy-decoded
// together (interleaved, so that one thread keeps several streams in flight), then
// each matrix is reconstructed: dequantize (mirroring the encoder's closed loop),
// inverse KLT, RoPE on K, and stores straight into the caller's KV view.
#include <array>
#include <atomic>
#include <cstring>
#include <thread>

#include "codec/bitstream.hpp"
#include "codec/byte_io.hpp"
#include "codec/chunk_plan.hpp"
#include "codec/decode_scratch.hpp"
#include "codec/layered_codec.hpp"
#include "codec/impl_access.hpp"

namespace kvstream::codec {

DecodeScratch::DecodeScratch() : impl_(std::make_unique<Impl>()) {}
DecodeScratch::~DecodeScratch() = default;
DecodeScratch::DecodeScratch(DecodeScratch&&) noexcept = default;
DecodeScratch& DecodeScratch::operator=(DecodeScratch&&) noexcept = default;

namespace {

struct ChunkContext {
  const Profile::Impl* p;
  std::span<const uint8_t> bytes;
  const ChunkHeader* h;
  std::vector<size_t> offsets;  // start of each substream in bytes
  const KvView* out;
};

std::string where(uint32_t l, uint32_t pl) { return fmt::format("layer {} plane {}", l, pl); }

// Reads one matrix's outlier lists and frames its coded symbols; the symbols
// themselves are decoded with the rest of the group.
Status parse_matrix(const ChunkContext& cx, uint32_t l, uint32_t pl, MatrixWork& w) {
  const Profile::Impl& p = *cx.p;
  const uint32_t C = p.geom.channels(), T = cx.h->info.tokens, G = p.group_size;
  const size_t si = size_t(l) * p.geom.planes() + pl;
  const std::span<const uint8_t> sub = cx.bytes.subspan(cx.offsets[si], cx.h->substream_bytes[si]);
  const uint32_t level = cx.h->info.level;
  w.l = l, w.pl = pl;
  const bool has_anchor = p.block_of(si) == 0 && p.has_anchor(l, pl);
  w.n_anchor_rows = has_anchor ? (T + G - 1) / G : 0;
  w.n_plain_rows = T - w.n_anchor_rows;
  w.table_plain = p.levels[level].table_of[kRolePlain].data() + p.idx(l, pl, 0);
  w.table_anchor = p.levels[level].table_of[kRoleAnchor].data() + p.idx(l, pl, 0);

  ByteReader r(sub, "substream");
  const auto name = [&] { return where(l, pl); };
  KVS_RETURN_IF_ERROR(read_exact_list(r, T, C, w.exact.out_index, w.exact.out_value, name));
  KVS_RETURN_IF_ERROR(read_exact_list(r, T, C, w.exact.direct_index, w.exact.direct_value, name));
  if (!w.exact.direct_index.empty() && p.block_of(si) == 0)
    return make_status(StatusCode::corrupt_data, "{}: exact values on a plane without a transform", where(l, pl));
  std::span<const uint8_t> rest = r.rest();
  auto frame = [&](uint32_t rows, std::span<const uint8_t>& code, const char* what) -> Status {
    code = {};
    if (!rows) return {};
    KVS_ASSIGN_OR_RETURN(size_t len, rans_coded_size(rest));
    if (len > rest.size()) return make_status(StatusCode::corrupt_data, "{}: truncated {}", where(l, pl), what);
    code = rest.first(len);
    rest = rest.subspan(len);
    return {};
  };
  KVS_RETURN_IF_ERROR(frame(w.n_plain_rows, w.plain_code, "symbols"));
  KVS_RETURN_IF_ERROR(frame(w.n_anchor_rows, w.anchor_code, "anchors"));
  if (!rest.empty()) return make_status(StatusCode::corrupt_data, "{}: {} trailing bytes", where(l, pl), rest.size());
  w.plain.resize(size_t(w.n_plain_rows) * C);
  w.anchors.resize(size_t(w.n_anchor_rows) * C);
  return {};
}

// Entropy-decodes the symbols of a group's matrices together.
Status decode_symbols(const ChunkContext& cx, std::span<MatrixWork> group) {
  const uint32_t C = cx.p->geom.channels();
  const RansTables& tables = *cx.p->levels[cx.h->info.level].rans;
  std::array<RansJob, 2 * kDecodeGroup> jobs;
  size_t n = 0;
  for (MatrixWork& w : group) {
    if (w.n_plain_rows) jobs[n++] = {{w.table_plain, C}, w.plain_code, w.plain.data(), w.n_plain_rows, C};
    if (w.n_anchor_rows) jobs[n++] = {{w.table_anchor, C}, w.anchor_code, w.anchors.data(), w.n_anchor_rows, C};
  }
  if (rans_decode_group(tables, std::span(jobs.data(), n)).ok()) return {};
  // Name the matrix that failed (error path only: decode its streams alone).
  for (MatrixWork& w : group) {
    if (w.n_plain_rows)
      if (Status st = rans_decode(tables, {w.table_plain, C}, w.plain_code, w.plain.data(), w.n_plain_rows, C);
          !st.ok())
        return st.with_context(where(w.l, w.pl));
    if (w.n_anchor_rows)
      if (Status st = rans_decode(tables, {w.table_anchor, C}, w.anchor_code, w.anchors.data(), w.n_anchor_rows, C);
          !st.ok())
        return st.with_context(where(w.l, w.pl) + " anchors");
  }
  return make_status(StatusCode::corrupt_data, "symbol streams of layers {}..{} do not decode", group.front().l,
                     group.back().l);
}

// Reconstruction of matrices with anchor channels, whose rows predict from the
// reconstruction of their group's anchor row: per tile of whole groups, each group's
// anchor row first (its outliers in place before it becomes the prediction), then
// the group's other rows with one dequantize call, then RoPE and the stores.
void reconstruct_rows(const ChunkContext& cx, const MatrixWork& w, DecodeScratch::Impl& s, uint64_t rope_row) {
  const Profile::Impl& p = *cx.p;
  const MatrixPlan& plan = s.plan;
  const uint32_t C = p.geom.channels(), T = cx.h->info.tokens, G = p.group_size;
  const bool rotate = unrotates(p, w.pl);
  const std::vector<uint32_t>& out_index = w.exact.out_index;
  const std::vector<float>& out_value = w.exact.out_value;
  const size_t n_out = out_index.size();
  const uint32_t tile = std::max<uint32_t>(1, 2048 / (C * G)) * G;
  std::vector<float>& tile_rows = s.plane.tile;
  tile_rows.resize(size_t(tile) * C);
  s.pred.assign(plan.base.begin(), plan.base.end());
  size_t next_out = 0;
  // Outliers of rows [.., end_t) replace the values dequantized into `tile` (row t0 first).
  auto patch = [&](uint32_t t0, uint32_t end_t) {
    for (; next_out < n_out && out_index[next_out] < uint64_t(end_t) * C; ++next_out)
      tile_rows[out_index[next_out] - uint64_t(t0) * C] = out_value[next_out];
  };
  for (uint32_t t0 = 0; t0 < T; t0 += tile) {
    const uint32_t rows = std::min(tile, T - t0);
    for (uint32_t g0 = t0; g0 < t0 + rows; g0 += G) {  // g0 is an anchor row
      float* row = &tile_rows[size_t(g0 - t0) * C];
      dequant_tile(&w.anchors[size_t(g0 / G) * C], plan.base.data(), plan.step.data(), row, 1, C);
      patch(t0, g0 + 1);
      for (uint32_t c = 0; c < C; ++c)
        if (plan.anchor[c]) s.pred[c] = row[c];
      const uint32_t n = std::min(G, t0 + rows - g0) - 1;
      if (n) {
        dequant_tile(&w.plain[size_t(plain_row(g0 + 1, G, true)) * C], s.pred.data(), plan.step.data(), row + C, n, C);
        patch(t0, g0 + 1 + n);
      }
    }
    if (rotate) s.rope.rotate_tile(tile_rows.data(), rows, rope_row + t0, p.geom.kv_heads, p.geom.head_dim);
    cx.out->store_rows(w.l, w.pl, t0, rows, tile_rows.data());
  }
}

void reconstruct(const ChunkContext& cx, const MatrixWork& w, DecodeScratch::Impl& s, uint64_t rope_row) {
  const Profile::Impl& p = *cx.p;
  const uint32_t T = cx.h->info.tokens;
  MatrixPlan& plan = s.plan;
  plan.build(p, cx.h->info.level, w.l, w.pl);
  if (plan.has_anchor) return reconstruct_rows(cx, w, s, rope_row);
  reconstruct_plane(p, plan, w.l, w.pl, T, w.plain.data(), w.exact, s.plane, s.rope, rope_row, *cx.out);
}

// Decodes matrices [first, first + count) of the chunk (index layer * planes + plane).
Status decode_group(const ChunkContext& cx, uint32_t first, uint32_t count, DecodeScratch::Impl& s) {
  const Profile::Impl& p = *cx.p;
  const uint32_t planes = p.geom.planes();
  const std::span<MatrixWork> group(s.work.data(), count);
  for (uint32_t i = 0; i < count; ++i)
    KVS_RETURN_IF_ERROR(parse_matrix(cx, (first + i) / planes, (first + i) % planes, group[i]));
  KVS_RETURN_IF_ERROR(decode_symbols(cx, group));
  const uint64_t rope_row =
      unrotates(p, 0) ? s.rope.ensure(p.rope, p.geom.head_dim, cx.h->info.first_position, cx.h->info.tokens) : 0;
  for (const MatrixWork& w : group) reconstruct(cx, w, s, rope_row);
  return {};
}

Result<ChunkContext> open_chunk(const Profile& profile, std::span<const uint8_t> bytes, const KvView& out,
                                ChunkHeader& h) {
  const Profile::Impl& p = ProfileAccess::of(profile);
  size_t off = 0;
  KVS_ASSIGN_OR_RETURN(h, parse_header_for(profile, bytes, &off));
  if (!(out.geometry() == p.geom))
    return make_status(StatusCode::invalid_argument, "output view geometry does not match the chunk");
  if (out.tokens() != h.info.tokens)
    return make_status(StatusCode::invalid_argument, "output view has {} tokens, the chunk {}", out.tokens(),
                       h.info.tokens);
  KVS_RETURN_IF_ERROR(verify_payload(bytes, off));
  ChunkContext cx{&p, bytes, nullptr, {}, &out};
  for (uint32_t len : h.substream_bytes) {
    cx.offsets.push_back(off);
    off += len;
  }
  return cx;
}

}  // namespace

Status decode_chunk(const Profile& profile, std::span<const uint8_t> bytes, const KvView& out,
                    DecodeScratch* scratch) {
  if (is_layered(bytes)) return decode_layered(profile, bytes, {}, out, scratch, 1);
  ChunkHeader h;
  KVS_ASSIGN_OR_RETURN(ChunkContext cx, open_chunk(profile, bytes, out, h));
  cx.h = &h;
  DecodeScratch local;
  DecodeScratch::Impl& s = scratch ? ScratchAccess::of(*scratch) : ScratchAccess::of(local);
  const Profile::Impl& p = ProfileAccess::of(profile);
  const uint32_t n = p.geom.layers * p.geom.planes();
  for (uint32_t i = 0; i < n; i += kDecodeGroup) KVS_RETURN_IF_ERROR(decode_group(cx, i, std::min(kDecodeGroup, n - i), s));
  return {};
}

Status decode_chunk_parallel(const Profile& profile, std::span<const uint8_t> bytes, const KvView& out,
                             unsigned threads) {
  if (threads <= 1) return decode_chunk(profile, bytes, out);
  if (is_layered(bytes)) return decode_layered(profile, bytes, {}, out, nullptr, threads);
  ChunkHeader h;
  KVS_ASSIGN_OR_RETURN(ChunkContext cx, open_chunk(profile, bytes, out, h));
  cx.h = &h;
  const Profile::Impl& p = ProfileAccess::of(profile);
  const uint32_t n = p.geom.layers * p.geom.planes();
  std::atomic<uint32_t> next{0};
  std::vector<Status> errors(threads);
  auto work = [&](unsigned id) {
    DecodeScratch scratch;
    DecodeScratch::Impl& s = ScratchAccess::of(scratch);
    for (uint32_t i; (i = next.fetch_add(kDecodeGroup)) < n;) {
      Status st = decode_group(cx, i, std::min(kDecodeGroup, n - i), s);
      if (!st.ok() && errors[id].ok()) errors[id] = st;
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& t : pool) t.join();
  for (const Status& e : errors) KVS_RETURN_IF_ERROR(e);
  return {};
}

}  // namespace kvstream::codec

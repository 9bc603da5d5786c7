// CPU decoder of progressive streams. Planes are taken a group at a time (the groups
// of the refinement layers): the base substreams' exact values and indices, then each
// refinement layer present for the group, which updates the indices in place, then
// the reconstruction of each plane at the level its indices reached. A refinement is
// the same decode over a longer prefix, read from the bytes the runtime kept and the
// bytes it fetched since.
#include <array>
#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>

#include "codec/byte_io.hpp"
#include "codec/decode_scratch.hpp"
#include "codec/layered_codec.hpp"
#include "codec/layered_format.hpp"
#include "codec/layered_quant.hpp"
#include "codec/impl_access.hpp"

namespace kvstream::codec {

namespace {

// A prefix held in two pieces split at a substream boundary.
struct Source {
  std::span<const uint8_t> kept, more;
  [[nodiscard]] std::span<const uint8_t> at(uint64_t offset, uint32_t len) const {
    if (offset + len <= kept.size()) return kept.subspan(offset, len);
    return more.subspan(offset - kept.size(), len);
  }
};

struct LayeredContext {
  const Profile::Impl* p;
  const LayeredHeader* h;
  PrefixExtent extent;
  Source src;
  const KvView* out;
};

std::string plane_where(uint32_t lp, uint32_t planes) { return fmt::format("layer {} plane {}", lp / planes, lp % planes); }

// The base substreams of the group's planes: exact values, and the coded matrix framed.
Status parse_base(const LayeredContext& cx, uint32_t first, uint32_t end, LayeredScratch& ls) {
  const Profile::Impl& p = *cx.p;
  const uint32_t C = p.geom.channels(), T = cx.h->info.tokens, P = p.geom.planes();
  for (uint32_t lp = first; lp < end; ++lp) {
    const size_t i = lp - first;
    ByteReader r(cx.src.at(cx.h->sub_offset[lp], cx.h->sub_bytes[lp]), "substream");
    const auto name = [&] { return plane_where(lp, P); };
    KVS_RETURN_IF_ERROR(read_exact_list(r, T, C, ls.exact[i].out_index, ls.exact[i].out_value, name));
    KVS_RETURN_IF_ERROR(read_exact_list(r, T, C, ls.exact[i].direct_index, ls.exact[i].direct_value, name));
    if (!ls.exact[i].direct_index.empty() && p.block_of(lp) == 0)
      return make_status(StatusCode::corrupt_data, "{}: exact values on a plane without a transform", plane_where(lp, P));
    const std::span<const uint8_t> rest = r.rest();
    KVS_ASSIGN_OR_RETURN(size_t len, rans_coded_size(rest));
    if (len != rest.size())
      return make_status(StatusCode::corrupt_data, "{}: base symbols of {} bytes in {}", plane_where(lp, P), len,
                         rest.size());
    ls.code[i] = rest;
  }
  return {};
}

// Entropy-decodes the base indices of the group's planes, up to 16 matrices at once.
Status decode_base(const LayeredContext& cx, uint32_t first, uint32_t end, LayeredScratch& ls) {
  const Profile::Impl& p = *cx.p;
  const uint32_t C = p.geom.channels(), T = cx.h->info.tokens;
  const size_t E = size_t(T) * C;
  const Profile::Impl::Level& lv = p.levels[p.level_of_layer(0)];
  constexpr uint32_t kBatch = 16;
  std::array<RansJob, kBatch> jobs;
  for (uint32_t b0 = first; b0 < end; b0 += kBatch) {
    const uint32_t b1 = std::min(end, b0 + kBatch);
    for (uint32_t lp = b0; lp < b1; ++lp)
      jobs[lp - b0] = {{lv.table_of[kRolePlain].data() + p.idx(lp / p.geom.planes(), lp % p.geom.planes(), 0), C},
                       ls.code[lp - first], ls.sym.data() + (lp - first) * E, T, C};
    if (Status st = rans_decode_group(*lv.rans, std::span(jobs.data(), b1 - b0)); !st.ok())
      return st.with_context(fmt::format("base layer of layers/planes {}..{}", b0, b1 - 1));
  }
  return {};
}

// Layer k's refinement of rows [row0, row0 + rows) of the group's planes, read from
// substream si: each symbol's table from its index's context, one rANS decode, the
// indices refined in place.
Status refine_rows(const LayeredContext& cx, uint32_t first, uint32_t end, uint32_t k, uint32_t row0, uint32_t rows,
                   size_t si, bool recent, LayeredScratch& ls) {
  const Profile::Impl& p = *cx.p;
  const LayeredHeader& h = *cx.h;
  const uint32_t C = p.geom.channels();
  const size_t E = size_t(h.info.tokens) * C, R = size_t(rows) * C, np = end - first;
  const Profile::Impl::Level& lv = p.levels[p.level_of_layer(k)];
  const uint8_t* zero = lv.table_of[kRoleCoarseZero].data() + size_t(first) * C;
  const uint8_t* nonzero = lv.table_of[kRoleCoarseNonzero].data() + size_t(first) * C;
  for (size_t i = 0; i < np; ++i)
    refinement_ids(&ls.q[i * E + size_t(row0) * C], zero + i * C, nonzero + i * C, &ls.ids[i * R], rows, C);
  if (Status st = rans_decode(*lv.rans, {ls.ids.data(), np * R}, cx.src.at(h.sub_offset[si], h.sub_bytes[si]),
                              ls.sym.data(), 1, np * R);
      !st.ok())
    return st.with_context(fmt::format("{}refinement layer {} of layers/planes {}..{}", recent ? "recent rows' " : "",
                                       k, first, end - 1));
  for (size_t i = 0; i < np; ++i) refine_indices(&ls.q[i * E + size_t(row0) * C], &ls.sym[i * R], R);
  return {};
}

// Layers k0..k1 of rows [0, rows) of the group's planes, decoded as one chain: layer
// k's table ids over a block of rows come from the indices layer k - 1 left there, so
// the layers run a block apart and their single streams interleave
// (rans_decode_chain) instead of each waiting on its own latency.
Status refine_chain(const LayeredContext& cx, uint32_t first, uint32_t end, uint32_t k0, uint32_t k1, uint32_t rows,
                    uint32_t g, LayeredScratch& ls) {
  const Profile::Impl& p = *cx.p;
  const LayeredHeader& h = *cx.h;
  const uint32_t C = p.geom.channels();
  const size_t E = size_t(h.info.tokens) * C, np = end - first, N = np * rows * C, M = k1 - k0 + 1;
  // The base's symbols and the layer-by-layer ids are spent by now (widened into q,
  // the recent rows refined): their buffers take the chain's, layer after layer.
  ls.ids.resize(M * N), ls.sym.resize(M * N);
  std::array<RansJob, 16> jobs;
  for (size_t m = 0; m < M; ++m) {
    const size_t si = h.refine_index(k0 + uint32_t(m), g);
    jobs[m] = {{ls.ids.data() + m * N, N}, cx.src.at(h.sub_offset[si], h.sub_bytes[si]), ls.sym.data() + m * N, 1, N};
  }
  // Blocks of whole rows, a multiple of a step (32 symbols), about 4096 symbols.
  const size_t unit = std::lcm(size_t(C), size_t(32)), block = std::max(unit, 4096 / unit * unit);
  auto hook = [&](size_t m, size_t b, size_t e, bool decoded) {
    const auto& table_of = p.chain_table_of[k0 + m - 1];
    const uint8_t* zero = table_of[kRoleCoarseZero].data() + size_t(first) * C;
    const uint8_t* nonzero = table_of[kRoleCoarseNonzero].data() + size_t(first) * C;
    // Global rows [b / C, e / C) of the planes laid end to end, plane by plane.
    for (size_t r = b / C; r < e / C;) {
      const size_t i = r / rows, lr = r % rows, n = std::min<size_t>(rows - lr, e / C - r);
      int32_t* q = &ls.q[i * E + lr * C];
      if (!decoded)
        refinement_ids(q, zero + i * C, nonzero + i * C, &ls.ids[m * N + r * C], uint32_t(n), C);
      else
        refine_indices(q, &ls.sym[m * N + r * C], n * C);
      r += n;
    }
  };
  if (Status st = rans_decode_chain(*p.refine_chain, std::span(jobs.data(), M), block, hook); !st.ok())
    return st.with_context(fmt::format("refinement layers {}..{} of layers/planes {}..{}", k0, k1, first, end - 1));
  return {};
}

// Every refinement layer 1..layers of the group's other rows: runs of layers over the
// same rows as one chain where the profile has the combined tables, else one by one.
Status refine_layers(const LayeredContext& cx, uint32_t first, uint32_t end, uint32_t g, uint32_t layers,
                     LayeredScratch& ls) {
  const LayeredHeader& h = *cx.h;
  for (uint32_t k0 = 1; k0 <= layers;) {
    uint32_t k1 = k0;
    while (k1 < layers && k1 - k0 + 1 < 16 && h.rows_of_layer(k1 + 1) == h.rows_of_layer(k0)) ++k1;
    if (k1 > k0 && cx.p->refine_chain) {
      KVS_RETURN_IF_ERROR(refine_chain(cx, first, end, k0, k1, h.rows_of_layer(k0), g, ls));
    } else {
      for (uint32_t k = k0; k <= k1; ++k)
        KVS_RETURN_IF_ERROR(refine_rows(cx, first, end, k, 0, h.rows_of_layer(k), h.refine_index(k, g), false, ls));
    }
    k0 = k1 + 1;
  }
  return {};
}

Status decode_group(const LayeredContext& cx, uint32_t g, DecodeScratch::Impl& s) {
  const Profile::Impl& p = *cx.p;
  const LayeredHeader& h = *cx.h;
  const uint32_t C = p.geom.channels(), T = h.info.tokens, P = p.geom.planes();
  const size_t E = size_t(T) * C;
  const uint32_t first = h.grouping.first_plane(g), end = h.grouping.end_plane(g);
  const size_t np = end - first, N = np * E;
  // The recent rows [T - R, T) carry layers 1..J in the base.
  const uint32_t J = h.recent_layers, R = h.recent_tokens, split = T - R;
  LayeredScratch& ls = s.layered;
  ls.exact.resize(np), ls.code.resize(np), ls.q.resize(N), ls.sym.resize(N), ls.ids.resize(N);
  KVS_RETURN_IF_ERROR(parse_base(cx, first, end, ls));
  KVS_RETURN_IF_ERROR(decode_base(cx, first, end, ls));
  const uint32_t layers = cx.extent.layers_of_group(g), recent_layer = h.recent_layer_of_group(cx.extent, g);
  const uint64_t rope_row =
      unrotates(p, 0) ? s.rope.ensure(p.rope, p.geom.head_dim, h.info.first_position, h.info.tokens) : 0;
  auto reconstruct = [&](uint32_t layer, uint32_t row0, uint32_t row_end, auto index_of) {
    for (uint32_t lp = first; lp < end && row0 < row_end; ++lp) {
      s.plan.build(p, p.level_of_layer(layer), lp / P, lp % P);
      reconstruct_rows(p, s.plan, lp / P, lp % P, row0, row_end, index_of(lp - first) + size_t(row0) * C,
                       ls.exact[lp - first], s.plane, s.rope, rope_row, *cx.out);
    }
  };
  // The recent rows' own layers: 1..J from the base, then (recent_lead) J+1.. from the
  // lead substreams of the refinement layers present.
  auto recent_layers = [&]() -> Status {
    for (uint32_t k = 1; k <= J; ++k) KVS_RETURN_IF_ERROR(refine_rows(cx, first, end, k, split, R, h.recent_index(k, g), true, ls));
    if (h.recent_lead)
      for (uint32_t k = J + 1; k <= recent_layer; ++k)
        KVS_RETURN_IF_ERROR(refine_rows(cx, first, end, k, split, R, h.lead_index(k - J, g), true, ls));
    return {};
  };
  auto int8_of = [&](size_t i) { return ls.sym.data() + i * E; };
  auto int32_of = [&](size_t i) { return ls.q.data() + i * E; };
  if (layers == 0) {
    // The other rows at the base (the level a deadline fetches): their int8 indices go
    // straight to the reconstruction, as a single-level stream's do (the same
    // arithmetic, so the same bits as through the 32-bit path); only the recent rows
    // are widened.
    reconstruct(0, 0, split, int8_of);
    if (J == 0) return {};
    for (size_t i = 0; i < np; ++i) widen_indices(int8_of(i) + size_t(split) * C, int32_of(i) + size_t(split) * C, size_t(R) * C);
    KVS_RETURN_IF_ERROR(recent_layers());
    reconstruct(recent_layer, split, T, int32_of);
    return {};
  }
  widen_indices(ls.sym.data(), ls.q.data(), N);
  KVS_RETURN_IF_ERROR(recent_layers());
  KVS_RETURN_IF_ERROR(refine_layers(cx, first, end, g, layers, ls));
  reconstruct(layers, 0, recent_layer == layers ? T : split, int32_of);
  if (recent_layer != layers) reconstruct(recent_layer, split, T, int32_of);
  return {};
}

}  // namespace

bool is_layered(std::span<const uint8_t> bytes) {
  if (bytes.size() < 6 || std::memcmp(bytes.data(), kChunkMagic, 4) != 0) return false;
  uint16_t version;
  std::memcpy(&version, bytes.data() + 4, 2);
  return version == kLayeredVersion;
}

Status decode_layered(const Profile& profile, std::span<const uint8_t> kept, std::span<const uint8_t> more,
                      const KvView& out, DecodeScratch* scratch, unsigned threads) {
  const Profile::Impl& p = ProfileAccess::of(profile);
  KVS_ASSIGN_OR_RETURN(const LayeredHeader h, parse_layered_header(kept));
  if (h.info.profile_hash != p.hash)
    return make_status(StatusCode::invalid_argument,
                       "chunk was encoded with codec profile {:016x}, not with this one ({:016x})",
                       h.info.profile_hash, p.hash);
  if (!p.progressive || !(h.info.geometry == p.geom) || h.group_size != p.group_size ||
      (h.flags & kFlagKBeforeRope) != uint8_t(p.k_before_rope) || h.layers != p.levels.size())
    return make_status(StatusCode::corrupt_data, "chunk header disagrees with its own profile");
  if (!more.empty()) {
    // Refinement: what was kept must itself be a whole prefix.
    if (Result<PrefixExtent> k = prefix_extent(h, kept.size()); !k.ok())
      return make_status(StatusCode::invalid_argument, "refinement: the kept bytes are not a prefix: {}",
                         k.status().message());
  }
  KVS_ASSIGN_OR_RETURN(const PrefixExtent extent, prefix_extent(h, uint64_t(kept.size()) + more.size()));
  if (!(out.geometry() == p.geom))
    return make_status(StatusCode::invalid_argument, "output view geometry does not match the chunk");
  if (out.tokens() != h.info.tokens)
    return make_status(StatusCode::invalid_argument, "output view has {} tokens, the chunk {}", out.tokens(),
                       h.info.tokens);
  LayeredContext cx{&p, &h, extent, {kept, more}, &out};
  // Every substream is checked before anything is written to the output.
  for (size_t i = 0; i < extent.substreams; ++i)
    if (substream_sum(cx.src.at(h.sub_offset[i], h.sub_bytes[i])) != h.sub_sum[i])
      return make_status(StatusCode::corrupt_data, "chunk substream {} checksum mismatch", i);
  const uint32_t groups = h.grouping.groups;
  if (threads <= 1 || groups == 1) {
    DecodeScratch local;
    DecodeScratch::Impl& s = scratch ? ScratchAccess::of(*scratch) : ScratchAccess::of(local);
    for (uint32_t g = 0; g < groups; ++g) KVS_RETURN_IF_ERROR(decode_group(cx, g, s));
    return {};
  }
  std::atomic<uint32_t> next{0};
  std::vector<Status> errors(threads);
  auto work = [&](unsigned id) {
    DecodeScratch local;
    for (uint32_t g; (g = next.fetch_add(1)) < groups;) {
      Status st = decode_group(cx, g, ScratchAccess::of(local));
      if (!st.ok() && errors[id].ok()) errors[id] = st;
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < std::min<unsigned>(threads, groups); ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& t : pool) t.join();
  for (const Status& e : errors) KVS_RETURN_IF_ERROR(e);
  return {};
}

Status refine_chunk(const Profile& profile, std::span<const uint8_t> kept, std::span<const uint8_t> more,
                    const KvView& out, DecodeScratch* scratch) {
  if (!is_layered(kept))
    return make_status(StatusCode::invalid_argument, "refine_chunk needs a prefix of a progressive stream");
  return decode_layered(profile, kept, more, out, scratch, 1);
}

}  // namespace kvstream::codec

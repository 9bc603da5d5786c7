// Encoder of progressive streams: each plane is quantized once at the finest layer's
// step, every coarser layer's index follows from it (layered_quant.hpp), the base
// layer is coded as a single-level stream's substreams are, and each refinement
// layer codes its symbols group by group with tables chosen by context. The encoder
// holds the exact KV, so it measures what every prefix will decode to (the distortion
// table of the header).
#include <algorithm>
#include <limits>

#include "codec/byte_io.hpp"
#include "codec/chunk_plan.hpp"
#include "codec/klt.hpp"
#include "codec/layered_codec.hpp"
#include "codec/layered_format.hpp"
#include "codec/layered_quant.hpp"
#include "codec/impl_access.hpp"

namespace kvstream::codec {

namespace {

// One plane in the coding domain, quantized: the indices of every layer and the
// squared error each layer leaves, in units of the channel's step scale.
struct PlaneCode {
  std::vector<int32_t> q;         // [layer][t * C + c]
  std::vector<ExactValue> outliers;    // exact values in the quantized domain
  std::vector<ExactValue> direct;      // KLT planes: exact pre-transform values
  std::vector<double> sq_error;   // per layer, rows [0, T - R)
  std::vector<double> sq_recent;  // per layer, the recent rows [T - R, T)
};

Status quantize_plane(const Profile::Impl& p, const KvView& chunk, uint32_t l, uint32_t pl, const RopeTable* rope,
                      uint32_t recent, PlaneCode& pc) {
  const uint32_t C = p.geom.channels(), T = uint32_t(chunk.tokens()), n = uint32_t(p.levels.size());
  const size_t E = size_t(T) * C;
  std::vector<MatrixPlan> plan(n);
  for (uint32_t k = 0; k < n; ++k) plan[k].build(p, p.level_of_layer(k), l, pl);
  const MatrixPlan& base = plan[0];
  const MatrixPlan& fine = plan[n - 1];
  const size_t b = p.idx(l, pl, 0);
  pc.q.assign(E * n, 0);
  pc.outliers.clear(), pc.direct.clear();
  pc.sq_error.assign(n, 0.0);
  pc.sq_recent.assign(n, 0.0);
  std::vector<float> row(C), z(base.block ? C : 0);
  std::vector<int32_t> qs(n);
  // As in a single-level stream at the base level.
  const float limit = std::max(127.0f * base.step[0], 32.0f);
  for (uint32_t t = 0; t < T; ++t) {
    coding_row(p, base, chunk, l, pl, t, rope, limit, row.data(), z.data(), pc.direct);
    std::vector<double>& sq = t < T - recent ? pc.sq_error : pc.sq_recent;
    for (uint32_t c = 0; c < C; ++c) {
      const float r = row[c] - fine.base[c];
      const size_t e = size_t(t) * C + c;
      if (!layered_indices(r, fine.inv[c], n, qs.data())) {
        pc.outliers.push_back({uint32_t(e), row[c]});
        continue;  // indices stay 0; the decoder puts the exact value back
      }
      const double unit = base.block ? 1.0 : double(p.step_scale[b + c]);
      for (uint32_t k = 0; k < n; ++k) {
        pc.q[k * E + e] = qs[k];
        const double err = (double(r) - double(float(qs[k]) * plan[k].step[c])) / unit;
        sq[k] += err * err;
      }
    }
  }
  for (const std::vector<ExactValue>* list : {&pc.outliers, &pc.direct})
    for (const ExactValue& o : *list)
      if (!std::isfinite(o.value))
        return make_status(StatusCode::invalid_argument, "layer {} plane {} token {} channel {} is not finite", l, pl,
                           o.index / C, o.index % C);
  return {};
}

// The base substream of a plane: exact values, then its base indices as one matrix.
Status write_base(const Profile::Impl& p, const PlaneCode& pc, uint32_t l, uint32_t pl, uint32_t T,
                  std::vector<uint8_t>& out) {
  const uint32_t C = p.geom.channels();
  ByteWriter w(out);
  for (const std::vector<ExactValue>* list : {&pc.outliers, &pc.direct}) {
    w.put(uint32_t(list->size()));
    for (const ExactValue& o : *list) w.put(o.index), w.put(o.value);
  }
  std::vector<int8_t> sym(size_t(T) * C);
  for (size_t e = 0; e < sym.size(); ++e) sym[e] = int8_t(pc.q[e]);
  const Profile::Impl::Level& lv = p.levels[p.level_of_layer(0)];
  return rans_encode(*lv.rans, {lv.table_of[kRolePlain].data() + p.idx(l, pl, 0), C}, sym.data(), T, C, out);
}

// One coded matrix of 1 row: layer k's refinement symbols of rows [row0, row0 + rows)
// of the group's planes, in (plane, token, channel) order, each with the table of its
// channel and context.
Status write_refinement(const Profile::Impl& p, const std::vector<PlaneCode>& codes, uint32_t first, uint32_t end,
                        uint32_t k, uint32_t T, uint32_t row0, uint32_t rows, std::vector<int8_t>& sym,
                        std::vector<uint8_t>& ids, std::vector<uint8_t>& out, std::vector<uint32_t>& lengths) {
  const uint32_t C = p.geom.channels();
  const size_t E = size_t(T) * C, R = size_t(rows) * C;
  const Profile::Impl::Level& lv = p.levels[p.level_of_layer(k)];
  sym.resize(size_t(end - first) * R), ids.resize(sym.size());
  for (uint32_t lp = first; lp < end; ++lp) {
    const PlaneCode& pc = codes[lp - first];
    const int32_t* coarse = &pc.q[(k - 1) * E + size_t(row0) * C];
    const int32_t* fine = &pc.q[k * E + size_t(row0) * C];
    const size_t at = size_t(lp - first) * R, b = size_t(lp) * C;
    const uint8_t* zero = lv.table_of[kRoleCoarseZero].data() + b;
    const uint8_t* nonzero = lv.table_of[kRoleCoarseNonzero].data() + b;
    for (size_t e0 = 0; e0 < R; e0 += C)
      for (uint32_t c = 0; c < C; ++c) {
        const size_t e = e0 + c;
        sym[at + e] = refinement_symbol(coarse[e], fine[e]);
        ids[at + e] = refinement_context(coarse[e]) ? nonzero[c] : zero[c];
      }
  }
  const size_t before = out.size();
  KVS_RETURN_IF_ERROR(rans_encode(*lv.rans, ids, sym.data(), 1, sym.size(), out));
  if (out.size() - before > UINT32_MAX)
    return make_status(StatusCode::out_of_range, "substream of {} bytes", out.size() - before);
  lengths.push_back(uint32_t(out.size() - before));
  return {};
}

}  // namespace

Status encode_layered(const Profile& profile, const KvView& chunk, uint32_t level, const EncodeOptions& options,
                      std::vector<uint8_t>& out) {
  const Profile::Impl& p = ProfileAccess::of(profile);
  const uint32_t T = uint32_t(chunk.tokens()), C = p.geom.channels(), n = uint32_t(p.levels.size());
  const size_t E = size_t(T) * C;
  // The recent rows: the chunk's last tokens among its context's last ones, which
  // carry the profile's recent layers in the base.
  const uint32_t J = options.recent_tokens && p.recent_tokens ? std::min(p.recent_layers, n - 1) : 0;
  const uint32_t R = J ? std::min(options.recent_tokens, T) : 0;
  RopeTable rope;
  if (unrotates(p, 0)) rope.build(p.rope, p.geom.head_dim, chunk.first_position(), T);

  LayeredHeader h;
  h.info = {p.geom, chunk.dtype(), chunk.first_position(), T, 0, p.hash, 0};
  h.group_size = uint16_t(p.group_size);
  h.flags = p.k_before_rope ? kFlagKBeforeRope : 0;
  h.layers = n;
  h.recent_tokens = R;
  h.recent_layers = J;
  h.recent_lead = J > 0 && p.recent_lead;
  h.grouping = layered_grouping(p.geom, T);
  const LayeredGrouping& G = h.grouping;
  const uint32_t leads = h.lead_layers();
  std::vector<std::vector<uint8_t>> layer_bytes(n), recent_bytes(J + 1), lead_bytes(n);
  std::vector<uint32_t> base_len;
  std::vector<std::vector<uint32_t>> ref_len(n), recent_len(J + 1), lead_len(n);
  // sq[lp][k] and sq_recent[lp][k]: the squared error plane lp leaves at layer k, in
  // its other rows and in its recent rows.
  std::vector<std::vector<double>> sq(G.planes), sq_recent(G.planes);
  std::vector<PlaneCode> codes;
  std::vector<int8_t> sym;
  std::vector<uint8_t> ids;
  for (uint32_t g = 0; g < G.groups; ++g) {
    const uint32_t first = G.first_plane(g), end = G.end_plane(g);
    codes.resize(end - first);
    for (uint32_t lp = first; lp < end; ++lp) {
      const uint32_t l = lp / p.geom.planes(), pl = lp % p.geom.planes();
      PlaneCode& pc = codes[lp - first];
      KVS_RETURN_IF_ERROR(quantize_plane(p, chunk, l, pl, unrotates(p, pl) ? &rope : nullptr, R, pc));
      const size_t before = layer_bytes[0].size();
      KVS_RETURN_IF_ERROR(write_base(p, pc, l, pl, T, layer_bytes[0]));
      if (layer_bytes[0].size() - before > UINT32_MAX)
        return make_status(StatusCode::out_of_range, "substream of {} bytes", layer_bytes[0].size() - before);
      base_len.push_back(uint32_t(layer_bytes[0].size() - before));
      sq[lp] = pc.sq_error;
      sq_recent[lp] = pc.sq_recent;
    }
    // The recent rows' layers 1..J, in the base; then every refinement layer: the
    // recent rows' layer k + J first when they lead, then the group's planes as one
    // sequence (without the recent rows through layer J, or at all when they lead).
    for (uint32_t k = 1; k <= J; ++k)
      KVS_RETURN_IF_ERROR(
          write_refinement(p, codes, first, end, k, T, T - R, R, sym, ids, recent_bytes[k], recent_len[k]));
    for (uint32_t k = 1; k < n; ++k) {
      if (k <= leads)
        KVS_RETURN_IF_ERROR(
            write_refinement(p, codes, first, end, k + J, T, T - R, R, sym, ids, lead_bytes[k], lead_len[k]));
      KVS_RETURN_IF_ERROR(write_refinement(p, codes, first, end, k, T, 0, h.rows_of_layer(k), sym, ids,
                                           layer_bytes[k], ref_len[k]));
    }
  }
  h.sub_bytes = base_len;
  for (uint32_t k = 1; k <= J; ++k) {
    h.sub_bytes.insert(h.sub_bytes.end(), recent_len[k].begin(), recent_len[k].end());
    layer_bytes[0].insert(layer_bytes[0].end(), recent_bytes[k].begin(), recent_bytes[k].end());
  }
  for (uint32_t k = 1; k < n; ++k) {
    h.sub_bytes.insert(h.sub_bytes.end(), lead_len[k].begin(), lead_len[k].end());
    h.sub_bytes.insert(h.sub_bytes.end(), ref_len[k].begin(), ref_len[k].end());
  }
  // Distortion after the base, then after each refinement substream in stream order.
  const double elems = double(E) * G.planes;
  auto mean_error = [&](size_t refined) {
    const PrefixExtent e = extent_after(h, refined);
    double s = 0;
    for (uint32_t g = 0; g < G.groups; ++g)
      for (uint32_t lp = G.first_plane(g); lp < G.end_plane(g); ++lp)
        s += sq[lp][e.layers_of_group(g)] + sq_recent[lp][h.recent_layer_of_group(e, g)];
    // The header holds a finite float >= 0 (the decoder checks it): an error beyond
    // float's range (a profile's extreme scales), or one that overflowed to NaN, is
    // stored as the largest float, which no quality target accepts.
    const double m = s / elems;
    return m < double(std::numeric_limits<float>::max()) ? float(m) : std::numeric_limits<float>::max();
  };
  for (size_t refined = 0; refined + h.base_substreams() <= h.sub_bytes.size(); ++refined)
    h.distortion.push_back(mean_error(refined));

  // Written whole (the header's checksums cover every substream), each layer its lead
  // substreams then its groups, then cut back to the level asked for; on error nothing
  // was appended.
  const size_t start = out.size();
  out.resize(start + layered_header_size(n, G, J, h.recent_lead));
  for (uint32_t k = 0; k < n; ++k) {
    out.insert(out.end(), lead_bytes[k].begin(), lead_bytes[k].end());
    out.insert(out.end(), layer_bytes[k].begin(), layer_bytes[k].end());
  }
  write_layered_header(out, start, h);
  size_t keep = h.header_bytes;
  const uint32_t last_layer = n - 1 - level;
  for (uint32_t k = 0; k <= last_layer; ++k) keep += lead_bytes[k].size() + layer_bytes[k].size();
  out.resize(start + keep);
  return {};
}

}  // namespace kvstream::codec

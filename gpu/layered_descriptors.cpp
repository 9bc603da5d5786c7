// Host parse of a progressive stream's prefix into the GPU kernels' work list
// (layered_descriptors.hpp). Mirrors codec/layered_decoder.cpp: the same checks in the
// same order, the same substreams, the same levels per layer.
#include "gpu/layered_descriptors.hpp"

#include "gpu/chunk_descriptors.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "codec/byte_io.hpp"
#include "codec/chunk_plan.hpp"
#include "codec/impl_access.hpp"
#include "codec/plane_reconstruct.hpp"
#include "codec/profile_impl.hpp"

namespace kvstream::gpu::detail {

using codec::Profile;
using codec::ProfileAccess;

Status parse_layered_chunk(const codec::Profile& profile, std::span<const uint64_t> ut_off,
                           std::span<const uint8_t> bytes, LayeredDescriptors& d) {
  const Profile::Impl& p = ProfileAccess::of(profile);
  KVS_ASSIGN_OR_RETURN(d.header, codec::parse_layered_header(bytes));
  const codec::LayeredHeader& h = d.header;
  if (h.info.profile_hash != p.hash)
    return make_status(StatusCode::invalid_argument,
                       "chunk was encoded with codec profile {:016x}, not with this one ({:016x})",
                       h.info.profile_hash, p.hash);
  if (!p.progressive || !(h.info.geometry == p.geom) || h.group_size != p.group_size ||
      (h.flags & codec::kFlagKBeforeRope) != uint8_t(p.k_before_rope) || h.layers != p.levels.size())
    return make_status(StatusCode::corrupt_data, "chunk header disagrees with its own profile");
  KVS_ASSIGN_OR_RETURN(d.extent, codec::prefix_extent(h, bytes.size()));
  for (size_t i = 0; i < d.extent.substreams; ++i)
    if (codec::substream_sum(bytes.subspan(h.sub_offset[i], h.sub_bytes[i])) != h.sub_sum[i])
      return make_status(StatusCode::corrupt_data, "chunk substream {} checksum mismatch", i);

  const uint32_t C = p.geom.channels(), T = h.info.tokens, P = p.geom.planes(), S = h.grouping.planes;
  const uint32_t J = h.recent_layers, R = h.recent_tokens, split = T - R;
  const uint64_t TC = uint64_t(T) * C;
  d.planes.assign(S, PlaneDesc{});
  d.list_index.clear(), d.list_value.clear(), d.mats.clear(), d.mat_where.clear(), d.steps.clear();
  std::vector<uint32_t> idx;
  std::vector<float> val;
  auto where = [&](uint32_t lp) { return fmt::format("layer {} plane {}", lp / P, lp % P); };

  // The base layer: exact values, then the plane's base indices as one [T][C] matrix.
  LayeredDescriptors::Step base;
  base.level = p.level_of_layer(0);
  for (uint32_t lp = 0; lp < S; ++lp) {
    PlaneDesc& pd = d.planes[lp];
    pd.plain_sym_off = uint64_t(lp) * TC;
    pd.chan_off = p.idx(lp / P, lp % P, 0);
    pd.ut_off = ut_off[lp];
    pd.block = p.block_of(lp);
    if (pd.block == 0 && p.has_anchor(lp / P, lp % P))
      return make_status(StatusCode::corrupt_data, "{}: an anchor predictor in a progressive profile", where(lp));
    pd.rotate = codec::unrotates(p, lp % P);
    pd.plane_index = lp;
    codec::ByteReader r(bytes.subspan(h.sub_offset[lp], h.sub_bytes[lp]), "substream");
    for (const bool direct : {false, true}) {
      KVS_RETURN_IF_ERROR(codec::read_exact_list(r, T, C, idx, val, [&] { return where(lp); }));
      (direct ? pd.exact_begin : pd.out_begin) = uint32_t(d.list_index.size());
      (direct ? pd.exact_count : pd.out_count) = uint32_t(idx.size());
      d.list_index.insert(d.list_index.end(), idx.begin(), idx.end());
      d.list_value.insert(d.list_value.end(), val.begin(), val.end());
    }
    if (pd.exact_count && pd.block == 0)
      return make_status(StatusCode::corrupt_data, "{}: exact values on a plane without a transform", where(lp));
    const size_t at = h.sub_offset[lp] + (h.sub_bytes[lp] - r.rest().size());
    MatDesc m{};
    KVS_RETURN_IF_ERROR(frame_matrix(bytes, at, r.rest().size(), TC, true, m, where(lp) + " base symbols").status());
    m.sym_off = uint64_t(lp) * TC;
    m.table_of_off = uint64_t(codec::kRolePlain) * p.channels_total() + pd.chan_off;
    m.rows = T, m.cols = C;
    d.mats.push_back(m);
    d.mat_where.push_back(where(lp));
  }
  base.n_mats = S;
  d.steps.push_back(base);

  // A refinement layer k over rows [row0, row0 + rows) of the first `groups` groups:
  // one matrix per group, 1 x (planes x rows x C) symbols with per-symbol table ids,
  // from the recent rows' substreams in the base (recent, k <= J), their lead
  // substreams in refinement layer k - J (recent, k > J) or the layer's groups.
  auto refine_step = [&](uint32_t k, uint32_t row0, uint32_t rows, uint32_t groups, bool recent) -> Status {
    LayeredDescriptors::Step st;
    st.level = p.level_of_layer(k);
    st.first_mat = uint32_t(d.mats.size());
    st.refine = true;
    st.planes = h.grouping.end_plane(groups - 1);
    st.row0 = row0, st.rows = rows;
    for (uint32_t g = 0; g < groups; ++g) {
      const size_t si = !recent ? h.refine_index(k, g) : k <= J ? h.recent_index(k, g) : h.lead_index(k - J, g);
      const uint32_t first = h.grouping.first_plane(g), end = h.grouping.end_plane(g);
      const uint64_t n = uint64_t(end - first) * rows * C;
      const std::string what = fmt::format("{}refinement layer {} of layers/planes {}..{}", recent ? "recent rows' " : "",
                                           k, first, end - 1);
      if (n > std::numeric_limits<uint32_t>::max())
        return make_status(StatusCode::out_of_range, "{}: {} symbols exceed 2^32 - 1", what, n);
      MatDesc m{};
      KVS_RETURN_IF_ERROR(frame_matrix(bytes, h.sub_offset[si], h.sub_bytes[si], n, true, m, what).status());
      m.sym_off = m.table_of_off = uint64_t(first) * rows * C;
      m.rows = 1, m.cols = uint32_t(n);
      d.mats.push_back(m);
      d.mat_where.push_back(what);
    }
    st.n_mats = uint32_t(d.mats.size()) - st.first_mat;
    d.steps.push_back(st);
    return {};
  };
  const uint32_t G = h.grouping.groups;
  for (uint32_t k = 1; k <= J; ++k) KVS_RETURN_IF_ERROR(refine_step(k, split, R, G, true));
  // Leading recent rows: layer J + k of every group whose lead substream is present.
  for (uint32_t k = 1; k <= h.lead_layers(); ++k) {
    const uint32_t groups = k <= d.extent.full_layers ? G : k == d.extent.full_layers + 1 ? d.extent.partial_lead : 0;
    if (groups == 0) break;
    KVS_RETURN_IF_ERROR(refine_step(J + k, split, R, groups, true));
  }
  const uint32_t deepest = d.extent.full_layers + (d.extent.partial_groups ? 1 : 0);
  for (uint32_t k = 1; k <= deepest; ++k)
    KVS_RETURN_IF_ERROR(refine_step(k, 0, h.rows_of_layer(k), k <= d.extent.full_layers ? G : d.extent.partial_groups,
                                    false));

  // The level each plane's rows reached.
  for (uint32_t g = 0; g < G; ++g) {
    const uint32_t layers = d.extent.layers_of_group(g);
    const float step = p.levels[p.level_of_layer(layers)].info.step;
    const float recent = p.levels[p.level_of_layer(h.recent_layer_of_group(d.extent, g))].info.step;
    for (uint32_t lp = h.grouping.first_plane(g); lp < h.grouping.end_plane(g); ++lp)
      d.planes[lp].step = step, d.planes[lp].recent_step = recent, d.planes[lp].split = split;
  }
  return {};
}

}  // namespace kvstream::gpu::detail

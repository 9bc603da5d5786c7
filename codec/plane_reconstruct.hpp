// Reconstruction of one (layer, plane) from its quantization indices, shared by the
// decoder of single-level streams (int8 symbols) and of progressive streams (the
// 32-bit indices their layers add up to): dequantize, exact values, inverse KLT,
// RoPE on K, and stores into the caller's KV view, a tile of rows at a time.
// Internal to the codec.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "codec/byte_io.hpp"
#include "codec/chunk_plan.hpp"

namespace kvstream::codec {

/// A substream's two lists of exact values (docs/bitstream.md): values in the
/// quantized domain (x, or the component y on KLT planes), then, on KLT planes only,
/// exact values that replace the reconstruction after the inverse transform.
struct ExactValues {
  std::vector<uint32_t> out_index, direct_index;
  std::vector<float> out_value, direct_value;
};

/// Reads one list (u32 count, then index/value pairs) of a plane of T x C values,
/// checking count, order, range and finiteness. Errors: corrupt_data naming the
/// plane, `where()`, called only then (formatting a name for every plane that reads
/// fine was 1% of a chunk's decode).
template <class Where>
Status read_exact_list(ByteReader& r, uint64_t T, uint32_t C, std::vector<uint32_t>& index,
                       std::vector<float>& value, const Where& where) {
  const uint32_t n = r.get<uint32_t>();
  if (!r.ok() || uint64_t(n) > T * C || uint64_t(n) * 8 > r.rest().size())
    return make_status(StatusCode::corrupt_data, "{}: bad outlier count", where());
  index.resize(n), value.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    index[i] = r.get<uint32_t>();
    value[i] = r.get<float>();
    if (uint64_t(index[i]) >= T * C || (i > 0 && index[i] <= index[i - 1]) || !std::isfinite(value[i]))
      return make_status(StatusCode::corrupt_data, "{}: bad outlier {}", where(), i);
  }
  return {};
}

/// Tiles and masks one plane's reconstruction works in (reused across planes).
struct PlaneScratch {
  std::vector<float> tile, tile2, z;
  std::vector<uint32_t> nz;  // nonzero masks of a tile's components (KLT planes)
};

/// Reconstructs rows [row0, row_end) of (l, pl) from their indices `q` (row row0
/// first, C per row) with `plan` (built for the level the indices are at; no anchor
/// channels): every row depends only on its own indices, so each stage runs over a
/// tile of rows, and a plane whose rows reached different levels is reconstructed a
/// row range at a time. `rope_row` is the table row of token 0 when K is rotated.
template <class Index>
void reconstruct_rows(const Profile::Impl& p, const MatrixPlan& plan, uint32_t l, uint32_t pl, uint32_t row0,
                      uint32_t row_end, const Index* q, const ExactValues& ex, PlaneScratch& s, const RopeTable& rope,
                      uint64_t rope_row, const KvView& out) {
  const uint32_t C = p.geom.channels();
  const bool rotate = unrotates(p, pl);
  const size_t n_out = ex.out_index.size(), n_direct = ex.direct_index.size();
  const uint32_t tile = std::max<uint32_t>(1, 2048 / C);
  s.tile.resize(size_t(tile) * C);
  const uint32_t words = (C + 31) / 32;
  if (plan.block) {
    // Room for the rows past a tile's end that the KLT computes and drops (their masks
    // are zeroed per tile below; their values may be anything).
    const uint32_t padded = (tile + kKltRows - 1) / kKltRows * kKltRows + kKltRows;
    s.tile2.resize(size_t(padded) * C), s.z.resize(kKltRows * size_t(C)), s.nz.resize(size_t(padded) * words);
  }
  const uint64_t first = uint64_t(row0) * C;
  size_t next_out = size_t(std::lower_bound(ex.out_index.begin(), ex.out_index.end(), first) - ex.out_index.begin());
  size_t next_direct =
      size_t(std::lower_bound(ex.direct_index.begin(), ex.direct_index.end(), first) - ex.direct_index.begin());
  for (uint32_t t0 = row0; t0 < row_end; t0 += tile) {
    const uint32_t rows = std::min(tile, row_end - t0);
    const Index* qt = &q[size_t(t0 - row0) * C];
    float* dq = plan.block ? s.tile2.data() : s.tile.data();
    dequant_tile(qt, plan.base.data(), plan.step.data(), dq, rows, C);
    const uint64_t end = uint64_t(t0 + rows) * C;
    if (plan.block) {
      nonzero_masks(qt, rows, C, s.nz.data());
      std::fill(s.nz.begin() + size_t(rows) * words, s.nz.end(), 0u);
    }
    for (; next_out < n_out && ex.out_index[next_out] < end; ++next_out) {
      const uint64_t i = ex.out_index[next_out] - uint64_t(t0) * C;
      dq[i] = ex.out_value[next_out];
      if (plan.block) s.nz[(i / C) * words + (i % C) / 32] |= 1u << (i % C % 32);
    }
    if (plan.block)
      klt_inverse_tile(plan.ut, plan.block, C, rows, dq, s.nz.data(), plan.mean, plan.scale, s.z.data(),
                       s.tile.data());
    for (; next_direct < n_direct && ex.direct_index[next_direct] < end; ++next_direct)
      s.tile[ex.direct_index[next_direct] - uint64_t(t0) * C] = ex.direct_value[next_direct];
    if (rotate) rope.rotate_tile(s.tile.data(), rows, rope_row + t0, p.geom.kv_heads, p.geom.head_dim);
    out.store_rows(l, pl, t0, rows, s.tile.data());
  }
}

/// Rows [0, T) of (l, pl) from indices `q` (T x C, row-major).
template <class Index>
void reconstruct_plane(const Profile::Impl& p, const MatrixPlan& plan, uint32_t l, uint32_t pl, uint32_t T,
                       const Index* q, const ExactValues& ex, PlaneScratch& s, const RopeTable& rope,
                       uint64_t rope_row, const KvView& out) {
  reconstruct_rows(p, plan, l, pl, 0, T, q, ex, s, rope, rope_row, out);
}

}  // namespace kvstream::codec

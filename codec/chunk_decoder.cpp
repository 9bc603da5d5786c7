// Chunk decoder (CPU): entropy-decode each (layer, plane) substream into int8
// symbols, dequantize row by row (mirroring the encoder's closed loop), redo RoPE on
// K, and store each row straight into the caller's KV view.
#include <atomic>
#include <cstring>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "codec/bitstream.hpp"
#include "codec/byte_io.hpp"
#include "codec/chunk_plan.hpp"

namespace kvstream::codec {

struct DecodeScratch::Impl {
  std::vector<int8_t> plain, anchors;
  std::vector<float> row, pred, z, tile, tile2;
  std::vector<uint32_t> out_index, direct_index;
  std::vector<float> out_value, direct_value;
  MatrixPlan plan;
  RopeTable rope;
};

DecodeScratch::DecodeScratch() : impl_(std::make_unique<Impl>()) {}
DecodeScratch::~DecodeScratch() = default;
DecodeScratch::DecodeScratch(DecodeScratch&&) noexcept = default;
DecodeScratch& DecodeScratch::operator=(DecodeScratch&&) noexcept = default;

namespace {

// The stages below are cloned for AVX-512 and AVX2 so their loops vectorise on
// either machine; the arithmetic (no fused multiply-add, fixed order) is identical.
// Not under ThreadSanitizer: the clones' ifunc resolver runs while the library is
// relocated, before TSan's runtime is up, and its instrumented entry crashes the load.
#if defined(__SANITIZE_THREAD__)
#define KVS_CLONED_FOR_SIMD
#else
#define KVS_CLONED_FOR_SIMD __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
KVS_CLONED_FOR_SIMD void dequant_tile(const int8_t* q, const float* pred,
                                                                               const float* step, float* out,
                                                                               uint32_t rows, uint32_t n) {
  for (uint32_t r = 0; r < rows; ++r, q += n, out += n)
    for (uint32_t c = 0; c < n; ++c) out[c] = pred[c] + float(q[c]) * step[c];
}

// x = mean + scale * (U y) over blocks of n channels. For each channel the products
// of the nonzero components are summed in increasing component order, without fused
// multiply-add, and a zero result is emitted as +0. Adding a zero product changes at
// most the sign of a zero sum, which that last rule erases, so decoders may skip zero
// components or not (this one skips those zero in both of a pair of rows) and still
// agree bit for bit.
typedef float v16f __attribute__((vector_size(64)));

// Bit j set when y[j] != 0, for j < width (a multiple of 4, at most 32).
inline uint32_t nonzero_mask(const float* y, uint32_t width) {
  uint32_t m = 0;
#if defined(__x86_64__)
  const __m128 zero = _mm_setzero_ps();  // SSE2 is in every x86-64 clone
  for (uint32_t j = 0; j < width; j += 4)
    m |= uint32_t(_mm_movemask_ps(_mm_cmpneq_ps(_mm_loadu_ps(y + j), zero))) << j;
#else
  for (uint32_t j = 0; j < width; ++j) m |= uint32_t(y[j] != 0.0f) << j;
#endif
  return m;
}

// Two rows of one block of 16 * NV channels; accumulators stay in registers and the
// two rows give independent add chains.
template <int NV>
inline __attribute__((always_inline)) void klt_block_2rows(const float* ut, const float* ya, const float* yb,
                                                           float* za, float* zb, bool two) {
  constexpr uint32_t n = 16 * NV;
  v16f acc_a[NV] = {}, acc_b[NV] = {};
  for (uint32_t j0 = 0; j0 < n; j0 += 32) {
    const uint32_t width = n - j0 < 32 ? n - j0 : 32;
    uint32_t m = nonzero_mask(ya + j0, width);
    if (two) m |= nonzero_mask(yb + j0, width);
    while (m) {
      const uint32_t j = j0 + uint32_t(__builtin_ctz(m));
      m &= m - 1;
      const float* col = ut + size_t(j) * n;
      const float a = ya[j], b = two ? yb[j] : 0.0f;
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        v16f c;
        std::memcpy(&c, col + 16 * v, sizeof c);
        acc_a[v] += c * a;
        acc_b[v] += c * b;
      }
    }
  }
  std::memcpy(za, acc_a, sizeof acc_a);
  if (two) std::memcpy(zb, acc_b, sizeof acc_b);
}

// Any block size: the same sums, one row at a time.
inline void klt_block_generic(const float* ut, uint32_t n, const float* y, float* z) {
  for (uint32_t c = 0; c < n; ++c) z[c] = 0.0f;
  for (uint32_t j = 0; j < n; ++j) {
    const float yj = y[j];
    if (yj == 0.0f) continue;
    const float* col = ut + size_t(j) * n;
    for (uint32_t c = 0; c < n; ++c) z[c] += col[c] * yj;
  }
}

KVS_CLONED_FOR_SIMD void klt_inverse_tile(
    const float* ut, uint32_t n, uint32_t C, uint32_t rows, const float* y, const float* mean, const float* scale,
    float* z, float* out) {
  for (uint32_t r = 0; r < rows; r += 2) {
    const bool two = r + 1 < rows;
    const float* ya = y + size_t(r) * C;
    const float* yb = two ? ya + C : ya;
    float* za = z;
    float* zb = z + C;
    for (uint32_t b = 0; b < C; b += n) {
      const float* blk = ut + size_t(b) * n;
      switch (n) {
        case 16: klt_block_2rows<1>(blk, ya + b, yb + b, za + b, zb + b, two); break;
        case 32: klt_block_2rows<2>(blk, ya + b, yb + b, za + b, zb + b, two); break;
        case 64: klt_block_2rows<4>(blk, ya + b, yb + b, za + b, zb + b, two); break;
        case 128: klt_block_2rows<8>(blk, ya + b, yb + b, za + b, zb + b, two); break;
        default:
          klt_block_generic(blk, n, ya + b, za + b);
          if (two) klt_block_generic(blk, n, yb + b, zb + b);
      }
    }
    for (uint32_t k = 0; k < (two ? 2u : 1u); ++k) {
      float* o = out + size_t(r + k) * C;
      const float* zz = z + size_t(k) * C;
      for (uint32_t c = 0; c < C; ++c) o[c] = (mean[c] + scale[c] * zz[c]) + 0.0f;  // + 0: a zero is +0
    }
  }
}

}  // namespace

KVS_CLONED_FOR_SIMD void rope_forward_tile(
    float* x, uint32_t rows, uint32_t first_t, uint32_t heads, uint32_t head_dim, uint32_t rot, bool interleaved,
    const float* ec, const float* es, const uint32_t* partner) {
  float tmp[1024];
  for (uint32_t r = 0; r < rows; ++r) {
    const float* c = ec + size_t(first_t + r) * rot;
    const float* s = es + size_t(first_t + r) * rot;
    for (uint32_t h = 0; h < heads; ++h) {
      float* v = x + (size_t(r) * heads + h) * head_dim;
      if (interleaved) {
        // Pairs are adjacent: the partner of d is d ^ 1, which vectorises as a shuffle.
        for (uint32_t d = 0; d < rot; ++d) tmp[d] = v[d] * c[d] + v[d ^ 1u] * s[d];
      } else {
        for (uint32_t d = 0; d < rot; ++d) tmp[d] = v[d] * c[d] + v[partner[d]] * s[d];
      }
      for (uint32_t d = 0; d < rot; ++d) v[d] = tmp[d];
    }
  }
}

namespace {

struct ChunkContext {
  const Profile::Impl* p;
  std::span<const uint8_t> bytes;
  const ChunkHeader* h;
  std::vector<size_t> offsets;  // start of each substream in bytes
  const KvView* out;
};

// Row-by-row reconstruction for matrices with anchor channels, whose predictions
// depend on the reconstruction of the group's anchor row.
Status reconstruct_rows(const ChunkContext& cx, uint32_t l, uint32_t pl, DecodeScratch::Impl& s, uint32_t n_out) {
  const Profile::Impl& p = *cx.p;
  const MatrixPlan& plan = s.plan;
  const uint32_t C = p.geom.channels(), T = cx.h->info.tokens, G = p.group_size;
  const bool rotate = unrotates(p, pl);
  s.row.resize(C);
  s.pred.assign(plan.base.begin(), plan.base.end());
  size_t next_out = 0;
  for (uint32_t t = 0; t < T; ++t) {
    const bool arow = is_anchor_row(t, G);
    const int8_t* q = arow ? &s.anchors[size_t(t / G) * C] : &s.plain[size_t(plain_row(t, G, true)) * C];
    dequant_tile(q, arow ? plan.base.data() : s.pred.data(), plan.step.data(), s.row.data(), 1, C);
    for (; next_out < n_out && s.out_index[next_out] / C == t; ++next_out)
      s.row[s.out_index[next_out] % C] = s.out_value[next_out];
    if (arow)
      for (uint32_t c = 0; c < C; ++c)
        if (plan.anchor[c]) s.pred[c] = s.row[c];
    if (rotate) s.rope.rotate_tile(s.row.data(), 1, t, p.geom.kv_heads, p.geom.head_dim);
    cx.out->store_row(l, pl, t, s.row.data());
  }
  return {};
}

Status decode_matrix(const ChunkContext& cx, uint32_t l, uint32_t pl, DecodeScratch::Impl& s) {
  const Profile::Impl& p = *cx.p;
  const uint32_t C = p.geom.channels(), T = cx.h->info.tokens, G = p.group_size;
  const size_t si = size_t(l) * p.geom.planes() + pl;
  const std::span<const uint8_t> sub = cx.bytes.subspan(cx.offsets[si], cx.h->substream_bytes[si]);
  auto where = [&] { return fmt::format("layer {} plane {}", l, pl); };

  MatrixPlan& plan = s.plan;
  plan.build(p, cx.h->info.level, l, pl);
  const uint32_t n_anchor_rows = plan.has_anchor ? (T + G - 1) / G : 0;
  const uint32_t n_plain_rows = T - n_anchor_rows;

  ByteReader r(sub, "substream");
  // Two outlier lists: values in the quantized domain, then (KLT planes only) exact
  // values that replace the reconstruction.
  auto read_outliers = [&](std::vector<uint32_t>& index, std::vector<float>& value) -> Status {
    const uint32_t n = r.get<uint32_t>();
    if (!r.ok() || uint64_t(n) > uint64_t(T) * C || uint64_t(n) * 8 > r.rest().size())
      return make_status(StatusCode::corrupt_data, "{}: bad outlier count", where());
    index.resize(n), value.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      index[i] = r.get<uint32_t>();
      value[i] = r.get<float>();
      if (uint64_t(index[i]) >= uint64_t(T) * C || (i > 0 && index[i] <= index[i - 1]) || !std::isfinite(value[i]))
        return make_status(StatusCode::corrupt_data, "{}: bad outlier {}", where(), i);
    }
    return {};
  };
  KVS_RETURN_IF_ERROR(read_outliers(s.out_index, s.out_value));
  KVS_RETURN_IF_ERROR(read_outliers(s.direct_index, s.direct_value));
  const uint32_t n_out = uint32_t(s.out_index.size()), n_direct = uint32_t(s.direct_index.size());
  if (n_direct && !plan.block)
    return make_status(StatusCode::corrupt_data, "{}: exact values on a plane without a transform", where());
  std::span<const uint8_t> rest = r.rest();
  const RansTables& tables = *p.levels[cx.h->info.level].rans;
  s.plain.resize(size_t(n_plain_rows) * C);
  s.anchors.resize(size_t(n_anchor_rows) * C);
  if (n_plain_rows) {
    KVS_ASSIGN_OR_RETURN(size_t len, rans_coded_size(rest));
    if (len > rest.size()) return make_status(StatusCode::corrupt_data, "{}: truncated symbols", where());
    Status st = rans_decode(tables, {plan.table_plain, C}, rest.first(len), s.plain.data(), n_plain_rows, C);
    if (!st.ok()) return st.with_context(where());
    rest = rest.subspan(len);
  }
  if (n_anchor_rows) {
    KVS_ASSIGN_OR_RETURN(size_t len, rans_coded_size(rest));
    if (len > rest.size()) return make_status(StatusCode::corrupt_data, "{}: truncated anchors", where());
    Status st = rans_decode(tables, {plan.table_anchor, C}, rest.first(len), s.anchors.data(), n_anchor_rows, C);
    if (!st.ok()) return st.with_context(where());
    rest = rest.subspan(len);
  }
  if (!rest.empty()) return make_status(StatusCode::corrupt_data, "{}: {} trailing bytes", where(), rest.size());

  const bool rotate = unrotates(p, pl);
  if (plan.has_anchor) return reconstruct_rows(cx, l, pl, s, n_out);
  // No anchors: every row depends only on its own symbols, so work a tile of rows per
  // stage (dequantize, outliers, KLT, RoPE, store) to keep the loops long.
  const uint32_t tile = std::max<uint32_t>(1, 2048 / C);
  s.tile.resize(size_t(tile) * C);
  if (plan.block) s.tile2.resize(size_t(tile) * C), s.z.resize(2 * size_t(C));
  size_t next_out = 0, next_direct = 0;
  for (uint32_t t0 = 0; t0 < T; t0 += tile) {
    const uint32_t rows = std::min(tile, T - t0);
    float* dq = plan.block ? s.tile2.data() : s.tile.data();
    dequant_tile(&s.plain[size_t(t0) * C], plan.base.data(), plan.step.data(), dq, rows, C);
    const uint64_t end = uint64_t(t0 + rows) * C;
    for (; next_out < n_out && s.out_index[next_out] < end; ++next_out)
      dq[s.out_index[next_out] - uint64_t(t0) * C] = s.out_value[next_out];
    if (plan.block)
      klt_inverse_tile(plan.ut, plan.block, C, rows, dq, plan.mean, plan.scale, s.z.data(), s.tile.data());
    for (; next_direct < n_direct && s.direct_index[next_direct] < end; ++next_direct)
      s.tile[s.direct_index[next_direct] - uint64_t(t0) * C] = s.direct_value[next_direct];
    if (rotate) s.rope.rotate_tile(s.tile.data(), rows, t0, p.geom.kv_heads, p.geom.head_dim);
    cx.out->store_rows(l, pl, t0, rows, s.tile.data());
  }
  return {};
}

Result<ChunkContext> open_chunk(const Profile& profile, std::span<const uint8_t> bytes, const KvView& out,
                                ChunkHeader& h) {
  const Profile::Impl& p = profile.impl();
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
  ChunkHeader h;
  KVS_ASSIGN_OR_RETURN(ChunkContext cx, open_chunk(profile, bytes, out, h));
  cx.h = &h;
  DecodeScratch local;
  DecodeScratch::Impl& s = scratch ? scratch->impl() : local.impl();
  const Profile::Impl& p = profile.impl();
  if (unrotates(p, 0)) s.rope.build(p.rope, p.geom.head_dim, h.info.first_position, h.info.tokens);
  for (uint32_t l = 0; l < p.geom.layers; ++l)
    for (uint32_t pl = 0; pl < p.geom.planes(); ++pl) KVS_RETURN_IF_ERROR(decode_matrix(cx, l, pl, s));
  return {};
}

Status decode_chunk_parallel(const Profile& profile, std::span<const uint8_t> bytes, const KvView& out,
                             unsigned threads) {
  if (threads <= 1) return decode_chunk(profile, bytes, out);
  ChunkHeader h;
  KVS_ASSIGN_OR_RETURN(ChunkContext cx, open_chunk(profile, bytes, out, h));
  cx.h = &h;
  const Profile::Impl& p = profile.impl();
  const uint32_t n = p.geom.layers * p.geom.planes();
  std::atomic<uint32_t> next{0};
  std::vector<Status> errors(threads);
  auto work = [&](unsigned id) {
    DecodeScratch scratch;
    DecodeScratch::Impl& s = scratch.impl();
    if (unrotates(p, 0)) s.rope.build(p.rope, p.geom.head_dim, h.info.first_position, h.info.tokens);
    for (uint32_t i; (i = next.fetch_add(1)) < n;) {
      Status st = decode_matrix(cx, i / p.geom.planes(), i % p.geom.planes(), s);
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

#include "kvstream/kv_model.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace kvstream {

Status KvGeometry::validate() const {
  if (layers == 0 || kv_heads == 0 || head_dim == 0)
    return make_status(StatusCode::invalid_argument, "KV geometry needs layers, kv_heads and head_dim > 0 (got {}x{}x{})",
                       layers, kv_heads, head_dim);
  if (layers > 4096 || kv_heads > 4096 || head_dim > 65536)
    return make_status(StatusCode::out_of_range, "KV geometry {}x{}x{} is beyond any real model", layers, kv_heads,
                       head_dim);
  switch (kind) {
    case AttentionKind::mha:
      if (q_heads != 0 && q_heads != kv_heads)
        return make_status(StatusCode::invalid_argument, "MHA needs q_heads == kv_heads ({} != {})", q_heads, kv_heads);
      break;
    case AttentionKind::gqa:
      if (q_heads == 0 || q_heads % kv_heads != 0)
        return make_status(StatusCode::invalid_argument, "GQA needs q_heads ({}) to be a multiple of kv_heads ({})",
                           q_heads, kv_heads);
      break;
    case AttentionKind::mla:
      if (kv_heads != 1)
        return make_status(StatusCode::invalid_argument, "MLA caches a single latent head (kv_heads {} != 1)", kv_heads);
      break;
    default:
      return make_status(StatusCode::invalid_argument, "unknown attention kind {}", int(kind));
  }
  return {};
}

KvStrides packed_strides(const KvGeometry& g, uint64_t tokens) noexcept {
  KvStrides s;
  s.channel = 1;
  s.token = g.channels();
  s.plane = int64_t(tokens) * g.channels();
  s.layer = s.plane * g.planes();
  return s;
}

Result<KvView> KvView::packed(void* base, DType dtype, const KvGeometry& g, uint64_t tokens, uint64_t first_position) {
  return strided(base, dtype, g, tokens, packed_strides(g, tokens), first_position);
}

Result<KvView> KvView::strided(void* base, DType dtype, const KvGeometry& g, uint64_t tokens, KvStrides strides,
                               uint64_t first_position) {
  KVS_RETURN_IF_ERROR(g.validate());
  if (base == nullptr && tokens > 0) return make_status(StatusCode::invalid_argument, "KV view over a null pointer");
  if (strides.channel == 0 || (g.channels() > 1 && strides.token == 0 && tokens > 1))
    return make_status(StatusCode::invalid_argument, "KV view strides alias distinct elements");
  KvView v;
  v.base_ = static_cast<std::byte*>(base);
  v.dtype_ = dtype;
  v.geom_ = g;
  v.tokens_ = tokens;
  v.first_position_ = first_position;
  v.strides_ = strides;
  v.channel_stride_ = strides.channel;
  v.head_stride_ = int64_t(g.head_dim) * strides.channel;
  return v;
}

PagedLayout PagedLayout::blocks(PagedOrder order, const KvGeometry& g, uint32_t block_size, uint64_t num_blocks,
                                std::vector<void*> keys, std::vector<void*> values, std::vector<uint32_t> block_table) {
  PagedLayout pl;
  pl.layer_base = std::move(keys);
  pl.value_base = std::move(values);
  pl.block_size = block_size;
  pl.num_blocks = num_blocks;
  pl.block_table = std::move(block_table);
  pl.channel_stride = 1;
  pl.block_stride = int64_t(block_size) * g.channels();
  if (order == PagedOrder::nhd) {
    pl.slot_stride = g.channels();
    pl.head_stride = g.head_dim;
  } else {
    pl.slot_stride = g.head_dim;
    pl.head_stride = int64_t(block_size) * g.head_dim;
  }
  return pl;
}

Result<KvView> KvView::paged(PagedLayout layout, DType dtype, const KvGeometry& g, uint64_t tokens,
                             uint64_t first_position) {
  KVS_RETURN_IF_ERROR(g.validate());
  if (layout.block_size == 0) return make_status(StatusCode::invalid_argument, "paged KV view: block_size is 0");
  if (layout.layer_base.size() != g.layers)
    return make_status(StatusCode::invalid_argument, "paged KV view: {} layer pointers for {} layers",
                       layout.layer_base.size(), g.layers);
  for (void* p : layout.layer_base)
    if (p == nullptr) return make_status(StatusCode::invalid_argument, "paged KV view: null layer pointer");
  if (!layout.value_base.empty()) {
    if (g.planes() != 2)
      return make_status(StatusCode::invalid_argument, "paged KV view: V plane pointers for a cache with one plane (MLA)");
    if (layout.value_base.size() != g.layers)
      return make_status(StatusCode::invalid_argument, "paged KV view: {} V plane pointers for {} layers",
                         layout.value_base.size(), g.layers);
    for (void* p : layout.value_base)
      if (p == nullptr) return make_status(StatusCode::invalid_argument, "paged KV view: null V plane pointer");
  }
  const uint64_t needed = (tokens + layout.block_size - 1) / layout.block_size;
  if (layout.block_table.size() < needed)
    return make_status(StatusCode::out_of_range, "paged KV view: block table has {} blocks, {} tokens need {}",
                       layout.block_table.size(), tokens, needed);
  for (uint64_t i = 0; i < needed; ++i)
    if (layout.block_table[i] >= layout.num_blocks)
      return make_status(StatusCode::out_of_range, "paged KV view: block table entry {} = {} >= num_blocks {}", i,
                         layout.block_table[i], layout.num_blocks);
  if (layout.channel_stride == 0) return make_status(StatusCode::invalid_argument, "paged KV view: channel stride 0");
  KvView v;
  v.dtype_ = dtype;
  v.geom_ = g;
  v.tokens_ = tokens;
  v.first_position_ = first_position;
  v.channel_stride_ = layout.channel_stride;
  v.head_stride_ = layout.head_stride != 0 ? layout.head_stride : int64_t(g.head_dim) * layout.channel_stride;
  v.paged_ = true;
  v.pages_ = std::move(layout);
  return v;
}

std::byte* KvView::row(uint32_t layer, uint32_t plane, uint64_t t) const noexcept {
  const size_t es = dtype_size(dtype_);
  const uint64_t tok = t + token_offset_;
  if (!paged_) {
    const int64_t off = int64_t(layer) * strides_.layer + int64_t(plane) * strides_.plane + int64_t(tok) * strides_.token;
    return base_ + off * int64_t(es);
  }
  const uint64_t block = pages_.block_table[tok / pages_.block_size];
  const uint64_t slot = tok % pages_.block_size;
  const int64_t off = int64_t(block) * pages_.block_stride + int64_t(slot) * pages_.slot_stride;
  if (plane == 1 && !pages_.value_base.empty())  // V in a tensor of its own
    return static_cast<std::byte*>(pages_.value_base[layer]) + off * int64_t(es);
  return static_cast<std::byte*>(pages_.layer_base[layer]) + (off + int64_t(plane) * pages_.plane_stride) * int64_t(es);
}

Result<KvView> KvView::slice(TokenRange r) const {
  if (r.begin > r.end || r.end > tokens_)
    return make_status(StatusCode::out_of_range, "KV view slice [{}, {}) outside [0, {})", r.begin, r.end, tokens_);
  KvView v = *this;
  v.token_offset_ = token_offset_ + r.begin;
  v.first_position_ = first_position_ + r.begin;
  v.tokens_ = r.size();
  return v;
}

// Rows whose heads lie apart (HND blocks) but whose heads are dense are converted one
// head at a time; anything else element by element.
void KvView::load_row(uint32_t layer, uint32_t plane, uint64_t t, float* out) const noexcept {
  const std::byte* p = row(layer, plane, t);
  const uint32_t n = geom_.channels(), hd = geom_.head_dim;
  if (rows_dense()) {
    convert_elements(p, dtype_, out, DType::f32, n);
  } else if (channel_stride_ == 1) {
    const int64_t es = int64_t(dtype_size(dtype_));
    for (uint32_t h = 0; h < geom_.kv_heads; ++h)
      convert_elements(p + int64_t(h) * head_stride_ * es, dtype_, out + size_t(h) * hd, DType::f32, hd);
  } else {
    for (uint32_t c = 0; c < n; ++c) out[c] = load_element(p, dtype_, size_t(channel_offset(c)));
  }
}

void KvView::store_row(uint32_t layer, uint32_t plane, uint64_t t, const float* in) const noexcept {
  std::byte* p = row(layer, plane, t);
  const uint32_t n = geom_.channels(), hd = geom_.head_dim;
  if (rows_dense()) {
    convert_elements(in, DType::f32, p, dtype_, n);
  } else if (channel_stride_ == 1) {
    const int64_t es = int64_t(dtype_size(dtype_));
    for (uint32_t h = 0; h < geom_.kv_heads; ++h)
      convert_elements(in + size_t(h) * hd, DType::f32, p + int64_t(h) * head_stride_ * es, dtype_, hd);
  } else {
    for (uint32_t c = 0; c < n; ++c) store_element(p, dtype_, size_t(channel_offset(c)), in[c]);
  }
}

void KvView::store_rows(uint32_t layer, uint32_t plane, uint64_t t, uint64_t n, const float* in) const noexcept {
  const uint32_t C = geom_.channels();
  if (!paged_ && rows_dense() && strides_.token == int64_t(C)) {
    convert_elements(in, DType::f32, row(layer, plane, t), dtype_, size_t(n) * C);
    return;
  }
  for (uint64_t r = 0; r < n; ++r) store_row(layer, plane, t + r, in + r * C);
}

Status copy_kv(const KvView& src, const KvView& dst) {
  if (!(src.geometry() == dst.geometry()))
    return make_status(StatusCode::invalid_argument, "copy_kv: geometries differ");
  if (src.tokens() != dst.tokens())
    return make_status(StatusCode::invalid_argument, "copy_kv: {} tokens into {}", src.tokens(), dst.tokens());
  const KvGeometry& g = src.geometry();
  const uint32_t n = g.channels();
  const bool dense = src.rows_dense() && dst.rows_dense();
  std::vector<float> tmp(dense ? 0 : n);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p)
      for (uint64_t t = 0; t < src.tokens(); ++t) {
        if (dense) {
          convert_elements(src.row(l, p, t), src.dtype(), dst.row(l, p, t), dst.dtype(), n);
        } else {
          src.load_row(l, p, t, tmp.data());
          dst.store_row(l, p, t, tmp.data());
        }
      }
  return {};
}

Result<KvCache> KvCache::create(const KvGeometry& g, DType dtype, uint64_t tokens, uint64_t first_position) {
  KVS_RETURN_IF_ERROR(g.validate());
  const uint64_t elems = g.elements_per_token() * tokens;
  if (tokens > (uint64_t(1) << 32) || elems > (uint64_t(1) << 40))
    return make_status(StatusCode::resource_exhausted, "KV cache of {} tokens is too large", tokens);
  KvCache c;
  c.geom_ = g;
  c.dtype_ = dtype;
  c.tokens_ = tokens;
  c.first_position_ = first_position;
  c.data_.assign(elems * dtype_size(dtype), std::byte{0});
  return c;
}

KvView KvCache::view() const {
  // The cache owns packed memory of a validated geometry, so this cannot fail.
  auto v = KvView::packed(const_cast<std::byte*>(data_.data()), dtype_, geom_, tokens_, first_position_);
  return v.ok() ? std::move(v).value() : KvView{};
}

float KvCache::at(uint32_t layer, uint32_t plane, uint64_t t, uint32_t c) const noexcept {
  return load_element(data_.data(), dtype_, index(layer, plane, t, c));
}

void KvCache::set(uint32_t layer, uint32_t plane, uint64_t t, uint32_t c, float v) noexcept {
  store_element(data_.data(), dtype_, index(layer, plane, t, c), v);
}

Status KvCache::truncate(uint64_t tokens) {
  if (tokens > tokens_)
    return make_status(StatusCode::out_of_range, "truncate to {} tokens of a {}-token cache", tokens, tokens_);
  if (tokens == tokens_) return {};
  const size_t es = dtype_size(dtype_);
  const size_t row_bytes = size_t(geom_.channels()) * es;
  // Packed layout: each (layer, plane) block shrinks, so move blocks down in order.
  for (size_t b = 0; b < size_t(geom_.layers) * geom_.planes(); ++b)
    std::memmove(data_.data() + b * tokens * row_bytes, data_.data() + b * tokens_ * row_bytes, tokens * row_bytes);
  tokens_ = tokens;
  data_.resize(size_t(geom_.elements_per_token()) * tokens * es);
  return {};
}

}  // namespace kvstream

// Chunk encoder: predict, quantize (closed loop, so the encoder's reconstruction is
// exactly the decoder's), entropy-code each (layer, plane) as an independent substream.
#include <algorithm>
#include <cstring>

#include "codec/bitstream.hpp"
#include "codec/byte_io.hpp"
#include "codec/chunk_plan.hpp"
#include "codec/klt.hpp"
#include "codec/layered_codec.hpp"
#include "codec/impl_access.hpp"

namespace kvstream::codec {

namespace {

// Encodes one (layer, plane) of the chunk and appends its substream to `out`.
Status encode_matrix(const Profile::Impl& p, const KvView& chunk, uint32_t level, uint32_t l, uint32_t pl,
                     const RopeTable* rope, std::vector<uint8_t>& out) {
  const uint32_t C = p.geom.channels(), T = uint32_t(chunk.tokens()), G = p.group_size;
  MatrixPlan plan;
  plan.build(p, level, l, pl);
  const uint32_t n_anchor_rows = plan.has_anchor ? (T + G - 1) / G : 0;
  std::vector<int8_t> plain(size_t(T - n_anchor_rows) * C), anchors(size_t(n_anchor_rows) * C);
  std::vector<ExactValue> outliers;  // exact values in the quantized domain (x, or y for KLT planes)
  std::vector<ExactValue> direct;    // KLT planes: exact pre-transform values, set after the inverse
  std::vector<float> row(C), anchor_recon(C, 0.0f), z(plan.block ? C : 0);
  const float limit = std::max(127.0f * plan.step[0], 32.0f);
  for (uint32_t t = 0; t < T; ++t) {
    coding_row(p, plan, chunk, l, pl, t, rope, limit, row.data(), z.data(), direct);
    const bool arow = plan.has_anchor && is_anchor_row(t, G);
    int8_t* sym = arow ? &anchors[size_t(t / G) * C] : &plain[size_t(plain_row(t, G, plan.has_anchor)) * C];
    for (uint32_t c = 0; c < C; ++c) {
      const float pred = plan.anchor[c] && !arow ? anchor_recon[c] : plan.base[c];
      const int q = quantize(row[c] - pred, plan.inv[c]);
      float recon;
      if (q == INT32_MIN) {
        outliers.push_back({t * C + c, row[c]});
        sym[c] = 0;
        recon = row[c];
      } else {
        sym[c] = int8_t(q);
        recon = pred + float(q) * plan.step[c];
      }
      if (arow && plan.anchor[c]) anchor_recon[c] = recon;
    }
  }
  for (const std::vector<ExactValue>* list : {&outliers, &direct})
    for (const ExactValue& o : *list)
      if (!std::isfinite(o.value))
      return make_status(StatusCode::invalid_argument, "layer {} plane {} token {} channel {} is not finite", l, pl,
                         o.index / C, o.index % C);
  ByteWriter w(out);
  for (const std::vector<ExactValue>* list : {&outliers, &direct}) {
    w.put(uint32_t(list->size()));
    for (const ExactValue& o : *list) w.put(o.index), w.put(o.value);
  }
  const RansTables& tables = *p.levels[level].rans;
  if (T > n_anchor_rows)
    KVS_RETURN_IF_ERROR(rans_encode(tables, {plan.table_plain, C}, plain.data(), T - n_anchor_rows, C, out));
  if (n_anchor_rows)
    KVS_RETURN_IF_ERROR(rans_encode(tables, {plan.table_anchor, C}, anchors.data(), n_anchor_rows, C, out));
  return {};
}

}  // namespace

std::vector<TokenRange> chunk_ranges(uint64_t tokens, uint32_t chunk_tokens) {
  std::vector<TokenRange> r;
  if (chunk_tokens == 0) return r;
  for (uint64_t b = 0; b < tokens; b += chunk_tokens) r.push_back({b, std::min<uint64_t>(tokens, b + chunk_tokens)});
  return r;
}

Status encode_chunk(const Profile& profile, const KvView& chunk, uint32_t level, std::vector<uint8_t>& out) {
  return encode_chunk(profile, chunk, level, EncodeOptions{}, out);
}

uint32_t recent_tokens_of(const Profile& profile, TokenRange chunk, uint64_t context_tokens) {
  const uint64_t window = ProfileAccess::of(profile).recent_tokens;
  if (!window || chunk.end > context_tokens || chunk.begin >= chunk.end) return 0;
  // The chunk's tokens at or after context_tokens - window.
  const uint64_t from = context_tokens > window ? context_tokens - window : 0;
  return chunk.end <= from ? 0 : uint32_t(chunk.end - std::max(chunk.begin, from));
}

Status encode_chunk(const Profile& profile, const KvView& chunk, uint32_t level, const EncodeOptions& options,
                    std::vector<uint8_t>& out) {
  const Profile::Impl& p = ProfileAccess::of(profile);
  if (!(chunk.geometry() == p.geom))
    return make_status(StatusCode::invalid_argument, "chunk geometry does not match the codec profile");
  if (level >= p.levels.size())
    return make_status(StatusCode::out_of_range, "level {} of a {}-level profile", level, p.levels.size());
  if (chunk.tokens() == 0 || chunk.tokens() > kMaxChunkTokens)
    return make_status(StatusCode::invalid_argument, "chunk of {} tokens (1..{})", chunk.tokens(), kMaxChunkTokens);
  const uint32_t T = uint32_t(chunk.tokens());
  if (uint64_t(T) * p.geom.channels() >= (uint64_t(1) << 32))
    return make_status(StatusCode::invalid_argument, "chunk of {} tokens x {} channels is too large for one bitstream",
                       T, p.geom.channels());
  if (options.recent_tokens > T)
    return make_status(StatusCode::invalid_argument, "{} recent tokens in a chunk of {}", options.recent_tokens, T);
  if (p.progressive) return encode_layered(profile, chunk, level, options, out);
  RopeTable rope;
  if (unrotates(p, 0)) rope.build(p.rope, p.geom.head_dim, chunk.first_position(), T);

  // Written in place at the end of `out` (no second copy of the chunk); on error `out`
  // is cut back to its old size so it never holds half a chunk.
  const size_t start = out.size();
  ChunkHeader h;
  h.info = {p.geom, chunk.dtype(), chunk.first_position(), T, level, p.hash, 0};
  h.group_size = uint16_t(p.group_size);
  h.flags = p.k_before_rope ? 1 : 0;
  begin_header(out, start, p.geom.layers * p.geom.planes());
  for (uint32_t l = 0; l < p.geom.layers; ++l)
    for (uint32_t pl = 0; pl < p.geom.planes(); ++pl) {
      const size_t before = out.size();
      Status st = encode_matrix(p, chunk, level, l, pl, unrotates(p, pl) ? &rope : nullptr, out);
      if (st.ok() && out.size() - before > UINT32_MAX)
        st = make_status(StatusCode::out_of_range, "substream of {} bytes", out.size() - before);
      if (!st.ok()) {
        out.resize(start);
        return st;
      }
      h.substream_bytes.push_back(uint32_t(out.size() - before));
    }
  finish_header(out, start, h);
  return {};
}

}  // namespace kvstream::codec

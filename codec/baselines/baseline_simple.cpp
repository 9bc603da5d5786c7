// Baselines without entropy coding: fp16, int-token, kivi, zstd-fp16; shared helpers;
// and the sweep (make_all_baselines).
#include <zstd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "codec/baselines/baseline.hpp"
#include "codec/baselines/baseline_internal.hpp"

namespace kvstream::codec::baselines {
namespace detail {

Status corrupt(std::string_view what) { return make_status(StatusCode::corrupt_data, "baseline object: {}", what); }

uint32_t fnv1a(std::span<const uint8_t> bytes, uint32_t h) noexcept {
  for (uint8_t b : bytes) h = (h ^ b) * 16777619u;
  return h;
}

Result<ChunkShape> shape_of(const KvView& v) {
  const KvGeometry& g = v.geometry();
  KVS_RETURN_IF_ERROR(g.validate());
  if (v.tokens() > std::numeric_limits<uint32_t>::max())
    return make_status(StatusCode::invalid_argument, "chunk of {} tokens: at most 2^32-1", v.tokens());
  if (g.planes() > 255) return make_status(StatusCode::invalid_argument, "too many planes");
  return ChunkShape{g.layers, g.planes(), g.channels(), uint32_t(v.tokens())};
}

void write_header(std::vector<uint8_t>& out, MethodId m, const ChunkShape& s) {
  ByteWriter w(out);
  w.u8('K');
  w.u8('B');
  w.u8(kVersion);
  w.u8(uint8_t(m));
  w.u8(uint8_t(s.planes));
  w.u32(s.layers);
  w.u32(s.channels);
  w.u32(s.tokens);
}

Status read_header(ByteReader& r, MethodId m, const KvView& out, ChunkShape* shape) {
  const uint8_t m0 = r.u8(), m1 = r.u8(), ver = r.u8(), meth = r.u8(), planes = r.u8();
  ChunkShape s;
  s.planes = planes;
  s.layers = r.u32();
  s.channels = r.u32();
  s.tokens = r.u32();
  if (!r.ok()) return corrupt("truncated header");
  if (m0 != 'K' || m1 != 'B') return corrupt("bad magic");
  if (ver != kVersion) return corrupt(fmt::format("unknown version {}", ver));
  if (meth != uint8_t(m)) return corrupt(fmt::format("method id {} where {} was expected", meth, uint8_t(m)));
  const KvGeometry& g = out.geometry();
  KVS_RETURN_IF_ERROR(g.validate());
  if (s.layers != g.layers || s.planes != g.planes() || s.channels != g.channels())
    return make_status(StatusCode::invalid_argument,
                       "object holds {} layers x {} planes x {} channels, output view has {} x {} x {}", s.layers,
                       s.planes, s.channels, g.layers, g.planes(), g.channels());
  if (s.tokens != out.tokens())
    return make_status(StatusCode::invalid_argument, "object holds {} tokens, output view has {}", s.tokens,
                       out.tokens());
  *shape = s;
  return {};
}

void load_matrix(const KvView& v, uint32_t layer, uint32_t plane, float* dst, bool keep_raw) {
  const uint32_t c = v.geometry().channels();
  for (uint64_t t = 0; t < v.tokens(); ++t) {
    float* row = dst + t * c;
    v.load_row(layer, plane, t, row);
    if (!keep_raw)
      for (uint32_t i = 0; i < c; ++i) row[i] = sanitize(row[i]);
  }
}

void store_all(const KvView& out, const ChunkShape& s, const std::vector<float>& stage) {
  size_t off = 0;
  for (uint32_t l = 0; l < s.layers; ++l)
    for (uint32_t p = 0; p < s.planes; ++p)
      for (uint32_t t = 0; t < s.tokens; ++t, off += s.channels) out.store_row(l, p, t, stage.data() + off);
}

}  // namespace detail

namespace {
using namespace detail;

// ---------------------------------------------------------------------------------
// fp16: header, then every element as fp16, [layer][plane][token][channel].

class Fp16Codec final : public BaselineCodec {
 public:
  std::string method() const override { return "fp16"; }
  std::string config() const override { return "fp16"; }

  Result<std::vector<uint8_t>> encode(const KvView& chunk) const override {
    KVS_ASSIGN_OR_RETURN(const ChunkShape s, shape_of(chunk));
    std::vector<uint8_t> out;
    out.reserve(kHeaderBytes + 2 * s.elements());
    write_header(out, MethodId::fp16, s);
    std::vector<float> row(s.channels);
    ByteWriter w(out);
    for (uint32_t l = 0; l < s.layers; ++l)
      for (uint32_t p = 0; p < s.planes; ++p)
        for (uint32_t t = 0; t < s.tokens; ++t) {
          chunk.load_row(l, p, t, row.data());
          for (float x : row) w.u16(f32_to_f16(x));
        }
    return out;
  }

  Status decode(std::span<const uint8_t> bytes, const KvView& out) const override {
    ByteReader r(bytes);
    ChunkShape s;
    KVS_RETURN_IF_ERROR(read_header(r, MethodId::fp16, out, &s));
    if (r.remaining() != 2 * s.elements())
      return corrupt(fmt::format("fp16 body has {} bytes, expected {}", r.remaining(), 2 * s.elements()));
    std::vector<float> row(s.channels);
    for (uint32_t l = 0; l < s.layers; ++l)
      for (uint32_t p = 0; p < s.planes; ++p)
        for (uint32_t t = 0; t < s.tokens; ++t) {
          for (float& x : row) x = f16_to_f32(r.u16());
          out.store_row(l, p, t, row.data());
        }
    return {};
  }
};

// ---------------------------------------------------------------------------------
// int-token: header, u8 bits; absmax (fp16) per (layer, plane, token) in that order;
// then codes q + qmax in `bits` bits each, LSB-first, [layer][plane][token][channel].

class IntTokenCodec final : public BaselineCodec {
 public:
  explicit IntTokenCodec(int bits) : bits_(bits), qmax_((1 << (bits - 1)) - 1) {}
  std::string method() const override { return "int-token"; }
  std::string config() const override { return fmt::format("int{}", bits_); }

  Result<std::vector<uint8_t>> encode(const KvView& chunk) const override {
    KVS_ASSIGN_OR_RETURN(const ChunkShape s, shape_of(chunk));
    std::vector<uint8_t> out;
    write_header(out, MethodId::int_token, s);
    ByteWriter w(out);
    w.u8(uint8_t(bits_));
    std::vector<float> mat(size_t(s.tokens) * s.channels);
    std::vector<uint8_t> codes;
    BitWriter bw(codes);
    for (uint32_t l = 0; l < s.layers; ++l)
      for (uint32_t p = 0; p < s.planes; ++p) {
        load_matrix(chunk, l, p, mat.data());
        for (uint32_t t = 0; t < s.tokens; ++t) {
          const float* row = mat.data() + size_t(t) * s.channels;
          const uint16_t mh = absmax_f16(row, s.channels);
          w.u16(mh);
          const float m = f16_to_f32(mh);
          for (uint32_t c = 0; c < s.channels; ++c) bw.put(uint32_t(quant_sym(row[c], m, qmax_) + qmax_), bits_);
        }
      }
    bw.flush();
    w.bytes(codes);
    return out;
  }

  Status decode(std::span<const uint8_t> bytes, const KvView& out) const override {
    ByteReader r(bytes);
    ChunkShape s;
    KVS_RETURN_IF_ERROR(read_header(r, MethodId::int_token, out, &s));
    const uint8_t bits = r.u8();
    if (!r.ok()) return corrupt("truncated parameters");
    if (bits != bits_) return corrupt(fmt::format("object has {} bits, codec {}", bits, bits_));
    const uint64_t want = 2 * s.rows() + (s.elements() * uint64_t(bits_) + 7) / 8;
    if (r.remaining() != want) return corrupt(fmt::format("body has {} bytes, expected {}", r.remaining(), want));
    ByteReader scales(r.rest().first(2 * s.rows()));
    BitReader br(r.rest().subspan(2 * s.rows()));
    std::vector<float> stage(s.elements());
    size_t off = 0;
    for (uint64_t row = 0; row < s.rows(); ++row) {
      const uint16_t mh = scales.u16();
      if (!f16_finite(mh) || (mh & 0x8000u)) return corrupt("negative or non-finite scale");
      const float m = f16_to_f32(mh);
      for (uint32_t c = 0; c < s.channels; ++c) {
        const int u = int(br.get(bits_));
        if (u > 2 * qmax_) return corrupt("code out of range");
        stage[off++] = dequant_sym(u - qmax_, m, qmax_);
      }
    }
    store_all(out, s, stage);
    return {};
  }

 private:
  int bits_;
  int qmax_;
};

// ---------------------------------------------------------------------------------
// kivi: header; u8 k_bits, u8 v_bits, u16 group; then per (layer, plane) the
// parameters (fp16 scale, fp16 zero point) of every group in order: K plane: for
// each token group, for each channel; V plane: for each token, for each channel
// group. Then all codes, `bits` each, LSB-first, [layer][plane][token][channel].

class KiviCodec final : public BaselineCodec {
 public:
  KiviCodec(int kb, int vb, int group) : kb_(kb), vb_(vb), g_(group) {}
  std::string method() const override { return "kivi"; }
  std::string config() const override {
    return vb_ ? fmt::format("k{}v{}g{}", kb_, vb_, g_) : fmt::format("k{}g{}", kb_, g_);
  }

  struct Param {
    float zp, scale;
  };

  // Parameter for values in [lo, hi] with `levels` (= 2^bits - 1) steps.
  static void make_param(float lo, float hi, int levels, uint16_t* zp_h, uint16_t* sc_h) {
    *zp_h = f16_floor(lo);
    const float zp = f16_to_f32(*zp_h);
    *sc_h = f16_ceil(std::max(0.0f, (hi - zp) / float(levels)));
  }
  static uint32_t quant(float x, float zp, float scale, int levels) {
    if (!(scale > 0.0f)) return 0;
    const float q = std::nearbyint((x - zp) / scale);
    return uint32_t(std::clamp(q, 0.0f, float(levels)));
  }
  static float dequant(uint32_t q, float zp, float scale) { return zp + float(q) * scale; }

  // Number of groups of one (layer, plane) matrix.
  uint64_t groups(uint32_t plane, const ChunkShape& s) const {
    if (plane == 0) return uint64_t((s.tokens + g_ - 1) / g_) * s.channels;
    const uint32_t cg = std::min<uint32_t>(g_, s.channels);
    return uint64_t(s.tokens) * ((s.channels + cg - 1) / cg);
  }
  int bits_of(uint32_t plane) const { return plane == 0 ? kb_ : vb_; }

  Result<std::vector<uint8_t>> encode(const KvView& chunk) const override {
    KVS_ASSIGN_OR_RETURN(const ChunkShape s, shape_of(chunk));
    if (s.planes > 1 && vb_ == 0)
      return make_status(StatusCode::invalid_argument, "kivi {} has no V setting for a two-plane cache", config());
    std::vector<uint8_t> out, codes;
    write_header(out, MethodId::kivi, s);
    ByteWriter w(out);
    w.u8(uint8_t(kb_));
    w.u8(uint8_t(vb_));
    w.u16(uint16_t(g_));
    BitWriter bw(codes);
    const uint32_t T = s.tokens, C = s.channels;
    std::vector<float> mat(size_t(T) * C);
    std::vector<uint32_t> q(size_t(T) * C);
    for (uint32_t l = 0; l < s.layers; ++l)
      for (uint32_t p = 0; p < s.planes; ++p) {
        load_matrix(chunk, l, p, mat.data());
        const int bits = bits_of(p), levels = (1 << bits) - 1;
        if (p == 0) {  // per channel over token groups
          for (uint32_t t0 = 0; t0 < T; t0 += g_) {
            const uint32_t t1 = std::min<uint32_t>(T, t0 + g_);
            for (uint32_t c = 0; c < C; ++c) {
              float lo = mat[size_t(t0) * C + c], hi = lo;
              for (uint32_t t = t0 + 1; t < t1; ++t) {
                lo = std::min(lo, mat[size_t(t) * C + c]);
                hi = std::max(hi, mat[size_t(t) * C + c]);
              }
              uint16_t zh, sh;
              make_param(lo, hi, levels, &zh, &sh);
              w.u16(sh);
              w.u16(zh);
              const float zp = f16_to_f32(zh), sc = f16_to_f32(sh);
              for (uint32_t t = t0; t < t1; ++t) q[size_t(t) * C + c] = quant(mat[size_t(t) * C + c], zp, sc, levels);
            }
          }
        } else {  // per token over channel groups
          const uint32_t cg = std::min<uint32_t>(g_, C);
          for (uint32_t t = 0; t < T; ++t)
            for (uint32_t c0 = 0; c0 < C; c0 += cg) {
              const uint32_t c1 = std::min(C, c0 + cg);
              const float* row = mat.data() + size_t(t) * C;
              const auto [mn, mx] = std::minmax_element(row + c0, row + c1);
              uint16_t zh, sh;
              make_param(*mn, *mx, levels, &zh, &sh);
              w.u16(sh);
              w.u16(zh);
              const float zp = f16_to_f32(zh), sc = f16_to_f32(sh);
              for (uint32_t c = c0; c < c1; ++c) q[size_t(t) * C + c] = quant(row[c], zp, sc, levels);
            }
        }
        for (uint32_t v : q) bw.put(v, bits);
      }
    bw.flush();
    w.bytes(codes);
    return out;
  }

  Status decode(std::span<const uint8_t> bytes, const KvView& out) const override {
    ByteReader r(bytes);
    ChunkShape s;
    KVS_RETURN_IF_ERROR(read_header(r, MethodId::kivi, out, &s));
    const uint8_t kb = r.u8(), vb = r.u8();
    const uint16_t g = r.u16();
    if (!r.ok()) return corrupt("truncated parameters");
    if (kb != kb_ || vb != vb_ || g != g_) return corrupt("kivi parameters differ from the codec's");
    if (s.planes > 1 && vb_ == 0) return corrupt("two-plane object for a single-plane configuration");
    uint64_t n_params = 0, n_bits = 0;
    for (uint32_t p = 0; p < s.planes; ++p) {
      n_params += s.layers * groups(p, s);
      n_bits += uint64_t(s.layers) * s.tokens * s.channels * bits_of(p);
    }
    const uint64_t want = 4 * n_params + (n_bits + 7) / 8;
    if (r.remaining() != want) return corrupt(fmt::format("body has {} bytes, expected {}", r.remaining(), want));
    ByteReader pr(r.rest().first(4 * n_params));
    BitReader br(r.rest().subspan(4 * n_params));
    const uint32_t T = s.tokens, C = s.channels;
    std::vector<float> stage(s.elements());
    std::vector<Param> params;
    size_t off = 0;
    for (uint32_t l = 0; l < s.layers; ++l)
      for (uint32_t p = 0; p < s.planes; ++p, off += size_t(T) * C) {
        params.resize(groups(p, s));
        for (auto& pa : params) {
          const uint16_t sh = pr.u16(), zh = pr.u16();
          if (!f16_finite(sh) || (sh & 0x8000u) || !f16_finite(zh)) return corrupt("non-finite or negative parameter");
          pa = {f16_to_f32(zh), f16_to_f32(sh)};
        }
        const int bits = bits_of(p);
        const uint32_t cg = std::min<uint32_t>(g_, C), ngc = (C + cg - 1) / cg;
        for (uint32_t t = 0; t < T; ++t)
          for (uint32_t c = 0; c < C; ++c) {
            const Param& pa = p == 0 ? params[size_t(t / g_) * C + c] : params[size_t(t) * ngc + c / cg];
            stage[off + size_t(t) * C + c] = dequant(br.get(bits), pa.zp, pa.scale);
          }
      }
    store_all(out, s, stage);
    return {};
  }

 private:
  int kb_, vb_, g_;
};

// ---------------------------------------------------------------------------------
// zstd-fp16: header; u8 level, u8 shuffle (1); then one zstd frame (with content size
// and checksum) of the fp16 elements [layer][plane][token][channel] as all low bytes
// followed by all high bytes.

class ZstdCodec final : public BaselineCodec {
 public:
  explicit ZstdCodec(int level) : level_(level) {}
  std::string method() const override { return "zstd-fp16"; }
  std::string config() const override { return fmt::format("zstd{}", level_); }

  Result<std::vector<uint8_t>> encode(const KvView& chunk) const override {
    KVS_ASSIGN_OR_RETURN(const ChunkShape s, shape_of(chunk));
    const size_t n = s.elements();
    std::vector<uint8_t> raw(2 * n);
    std::vector<float> row(s.channels);
    size_t i = 0;
    for (uint32_t l = 0; l < s.layers; ++l)
      for (uint32_t p = 0; p < s.planes; ++p)
        for (uint32_t t = 0; t < s.tokens; ++t) {
          chunk.load_row(l, p, t, row.data());
          for (float x : row) {
            const uint16_t h = f32_to_f16(x);
            raw[i] = uint8_t(h);
            raw[n + i] = uint8_t(h >> 8);
            ++i;
          }
        }
    std::vector<uint8_t> out;
    write_header(out, MethodId::zstd_fp16, s);
    out.push_back(uint8_t(level_));
    out.push_back(1);
    const size_t head = out.size();
    out.resize(head + ZSTD_compressBound(raw.size()));
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    if (!cctx) return make_status(StatusCode::resource_exhausted, "ZSTD_createCCtx failed");
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level_);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
    const size_t z = ZSTD_compress2(cctx, out.data() + head, out.size() - head, raw.data(), raw.size());
    ZSTD_freeCCtx(cctx);
    if (ZSTD_isError(z)) return make_status(StatusCode::internal, "zstd: {}", ZSTD_getErrorName(z));
    out.resize(head + z);
    return out;
  }

  Status decode(std::span<const uint8_t> bytes, const KvView& out) const override {
    ByteReader r(bytes);
    ChunkShape s;
    KVS_RETURN_IF_ERROR(read_header(r, MethodId::zstd_fp16, out, &s));
    const uint8_t level = r.u8(), shuffle = r.u8();
    if (!r.ok()) return corrupt("truncated parameters");
    if (level != uint8_t(level_) || shuffle != 1) return corrupt("zstd parameters differ from the codec's");
    const auto frame = r.rest();
    const size_t n = s.elements();
    const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
    if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN || content != 2 * n)
      return corrupt("zstd frame header missing or of the wrong size");
    const size_t fsize = ZSTD_findFrameCompressedSize(frame.data(), frame.size());
    if (ZSTD_isError(fsize) || fsize != frame.size()) return corrupt("zstd frame truncated or followed by junk");
    std::vector<uint8_t> raw(2 * n);
    const size_t got = ZSTD_decompress(raw.data(), raw.size(), frame.data(), frame.size());
    if (ZSTD_isError(got)) return corrupt(fmt::format("zstd: {}", ZSTD_getErrorName(got)));
    if (got != raw.size()) return corrupt("zstd frame decoded to the wrong size");
    std::vector<float> row(s.channels);
    size_t i = 0;
    for (uint32_t l = 0; l < s.layers; ++l)
      for (uint32_t p = 0; p < s.planes; ++p)
        for (uint32_t t = 0; t < s.tokens; ++t) {
          for (float& x : row) {
            x = f16_to_f32(uint16_t(raw[i] | (raw[n + i] << 8)));
            ++i;
          }
          out.store_row(l, p, t, row.data());
        }
    return {};
  }

 private:
  int level_;
};

}  // namespace

// ---------------------------------------------------------------------------------

std::unique_ptr<BaselineCodec> make_fp16() { return std::make_unique<Fp16Codec>(); }

std::unique_ptr<BaselineCodec> make_int_token(int bits) {
  return std::make_unique<IntTokenCodec>(std::clamp(bits, 2, 8));
}

std::unique_ptr<BaselineCodec> make_kivi(int k_bits, int v_bits, int group) {
  return std::make_unique<KiviCodec>(std::clamp(k_bits, 1, 8), v_bits <= 0 ? 0 : std::clamp(v_bits, 1, 8),
                                     std::clamp(group, 1, 65535));
}

std::unique_ptr<BaselineCodec> make_zstd_fp16(int level) {
  return std::make_unique<ZstdCodec>(std::clamp(level, 1, ZSTD_maxCLevel()));
}

std::vector<std::unique_ptr<BaselineCodec>> make_all_baselines(const KvGeometry& g) {
  const bool mla = g.planes() == 1;
  std::vector<std::unique_ptr<BaselineCodec>> all;
  all.push_back(make_fp16());
  for (int b : {8, 6, 5, 4}) all.push_back(make_int_token(b));
  for (int kb = 2; kb <= 5; ++kb)
    for (int vb = 1; vb <= 4; ++vb) {
      if (mla && vb > 1) break;
      for (int grp : {32, 64, 128}) all.push_back(make_kivi(kb, mla ? 0 : vb, grp));
    }
  for (int lvl : {3, 19}) all.push_back(make_zstd_fp16(lvl));
  all.push_back(make_cachegen_code(32, 16));
  for (int kb : {8, 12, 16, 24, 32, 48, 64})
    for (int vb : {4, 6, 8, 12, 16, 24, 32}) {
      all.push_back(make_cachegen_static(kb, mla ? 0 : vb));
      if (mla) break;
    }
  for (int f2 : {1, 2, 4}) {  // factors 0.5, 1, 2 of 32-16
    const int hi = 16 * f2, lo = 8 * f2;
    all.push_back(make_cachegen_paper(10, hi, lo, mla ? 0 : hi, mla ? 0 : lo));
  }
  return all;
}

}  // namespace kvstream::codec::baselines

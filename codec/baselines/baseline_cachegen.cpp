// CacheGen baselines: cachegen-code (LMCache's published design, tables shipped per
// chunk), cachegen-static (static tables learned by train()) and cachegen-paper
// (anchor + delta tokens, static tables). All code int8 symbol matrices with the
// interleaved rANS coder of codec/entropy/rans.hpp.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "codec/baselines/baseline.hpp"
#include "codec/baselines/baseline_internal.hpp"
#include "codec/entropy/rans.hpp"

namespace kvstream::codec::baselines {

int cachegen_layer_bins(uint32_t layers, uint32_t layer, uint32_t plane, int hi_bins, int lo_bins) noexcept {
  // LMCache (32-layer models): K layers [0, 10) and V layers [0, 2) get the high bins.
  const uint32_t published = plane == 0 ? 10u : 2u;
  const uint32_t hi_layers = layers >= 32 ? published : (published * layers + 31) / 32;
  return layer < hi_layers ? hi_bins : lo_bins;
}

namespace {
using namespace detail;

constexpr int kAnchorQmax = 127;  // 8-bit anchors: 255 levels
constexpr size_t kHist = 256;     // histogram entries per column (value + 128)

inline int qmax_of_bins(int bins) { return bins / 2 - 1; }

/// Per-token absmax quantization of a tokens x channels matrix.
void quantize_tokens(const float* mat, uint32_t T, uint32_t C, int qmax, int8_t* q, uint16_t* m) {
  for (uint32_t t = 0; t < T; ++t) {
    const float* row = mat + size_t(t) * C;
    m[t] = absmax_f16(row, C);
    const float mf = f16_to_f32(m[t]);
    for (uint32_t c = 0; c < C; ++c) q[size_t(t) * C + c] = int8_t(quant_sym(row[c], mf, qmax));
  }
}

/// Rows of a chunk of T tokens that are anchors (token t with t % group == 0).
inline uint32_t anchor_rows(uint32_t T, uint32_t group) { return (T + group - 1) / group; }

/// Paper quantization: anchors (qa: A x C, ma: A) and deltas (qd: D x C, md: D).
void paper_quantize(const float* mat, uint32_t T, uint32_t C, uint32_t group, int qmax_d, int8_t* qa, uint16_t* ma,
                    int8_t* qd, uint16_t* md) {
  std::vector<float> anchor(C), delta(C);
  uint32_t a = 0, d = 0;
  for (uint32_t t = 0; t < T; ++t) {
    const float* row = mat + size_t(t) * C;
    if (t % group == 0) {
      ma[a] = absmax_f16(row, C);
      const float m = f16_to_f32(ma[a]);
      for (uint32_t c = 0; c < C; ++c) {
        const int q = quant_sym(row[c], m, kAnchorQmax);
        qa[size_t(a) * C + c] = int8_t(q);
        anchor[c] = dequant_sym(q, m, kAnchorQmax);
      }
      ++a;
    } else {
      for (uint32_t c = 0; c < C; ++c) delta[c] = row[c] - anchor[c];
      md[d] = absmax_f16(delta.data(), C);
      const float m = f16_to_f32(md[d]);
      for (uint32_t c = 0; c < C; ++c) qd[size_t(d) * C + c] = int8_t(quant_sym(delta[c], m, qmax_d));
      ++d;
    }
  }
}

/// Inverse of paper_quantize (bit-exact with the encoder's anchor reconstruction).
void paper_dequantize(const int8_t* qa, const uint16_t* ma, const int8_t* qd, const uint16_t* md, uint32_t T,
                      uint32_t C, uint32_t group, int qmax_d, float* out) {
  std::vector<float> anchor(C);
  uint32_t a = 0, d = 0;
  for (uint32_t t = 0; t < T; ++t) {
    float* row = out + size_t(t) * C;
    if (t % group == 0) {
      const float m = f16_to_f32(ma[a]);
      for (uint32_t c = 0; c < C; ++c) row[c] = anchor[c] = dequant_sym(qa[size_t(a) * C + c], m, kAnchorQmax);
      ++a;
    } else {
      const float m = f16_to_f32(md[d]);
      for (uint32_t c = 0; c < C; ++c) row[c] = anchor[c] + dequant_sym(qd[size_t(d) * C + c], m, qmax_d);
      ++d;
    }
  }
}

/// Adds a rows x cols symbol matrix into per-column histograms (cols x 256).
void accumulate(const int8_t* q, size_t rows, size_t cols, std::vector<uint64_t>& hist) {
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) ++hist[c * kHist + size_t(q[r * cols + c] + 128)];
}

/// Reads `n` fp16 scales; rejects negative and non-finite ones.
Status read_scales(ByteReader& r, size_t n, uint16_t* m) {
  if (r.remaining() < 2 * n) return corrupt("truncated scales");
  for (size_t i = 0; i < n; ++i) {
    m[i] = r.u16();
    if (!f16_finite(m[i]) || (m[i] & 0x8000u)) return corrupt("negative or non-finite scale");
  }
  return {};
}

/// Takes the next coded matrix from `r` and decodes it; checks every symbol is in
/// [-qmax, qmax].
Status decode_matrix(ByteReader& r, const RansTables& tables, std::span<const uint8_t> ids, int8_t* out,
                     size_t rows, size_t cols, int qmax) {
  auto size = rans_coded_size(r.rest());
  if (!size.ok()) return size.status();
  if (*size > r.remaining()) return corrupt("truncated coded matrix");
  const auto in = r.rest().first(*size);
  r.skip(*size);
  KVS_RETURN_IF_ERROR(rans_decode(tables, ids, in, out, rows, cols));
  for (size_t i = 0; i < rows * cols; ++i)
    if (out[i] < -qmax || out[i] > qmax) return corrupt("decoded symbol out of range");
  return {};
}

// ---------------------------------------------------------------------------------
// Static models (learned by train()).

/// Tables of one coded matrix: at most 256 tables and the table of every column.
struct MatrixModel {
  std::vector<FreqTable> tables;
  std::vector<uint8_t> ids;
};

/// Builds a matrix model from per-column histograms (cols x 256). Columns without
/// counts get a flat histogram over [-max_abs, max_abs]. With more columns than
/// `max_tables`, columns are sorted by entropy and cut into `max_tables` runs of
/// equal length; each run shares the table of its summed histogram.
Result<MatrixModel> build_model(std::vector<uint64_t> hist, size_t cols, int max_abs, size_t max_tables) {
  MatrixModel mm;
  std::vector<double> ent(cols);
  for (size_t c = 0; c < cols; ++c) {
    auto h = std::span<uint64_t>(hist).subspan(c * kHist, kHist);
    if (std::accumulate(h.begin(), h.end(), uint64_t(0)) == 0)
      for (int v = -max_abs; v <= max_abs; ++v) h[size_t(v + 128)] = 1;
    ent[c] = FreqTable::entropy_bits(h);
  }
  if (cols <= max_tables) {
    for (size_t c = 0; c < cols; ++c) {
      KVS_ASSIGN_OR_RETURN(auto t, FreqTable::from_counts(std::span(hist).subspan(c * kHist, kHist), max_abs));
      mm.tables.push_back(std::move(t));
      mm.ids.push_back(uint8_t(c));
    }
    return mm;
  }
  std::vector<size_t> order(cols);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ent[a] < ent[b]; });
  std::vector<uint64_t> merged(max_tables * kHist, 0);
  mm.ids.assign(cols, 0);
  for (size_t rank = 0; rank < cols; ++rank) {
    const size_t c = order[rank], k = rank * max_tables / cols;
    mm.ids[c] = uint8_t(k);
    for (size_t i = 0; i < kHist; ++i) merged[k * kHist + i] += hist[c * kHist + i];
  }
  for (size_t k = 0; k < max_tables; ++k) {
    KVS_ASSIGN_OR_RETURN(auto t, FreqTable::from_counts(std::span(merged).subspan(k * kHist, kHist), max_abs));
    mm.tables.push_back(std::move(t));
  }
  return mm;
}

uint32_t fingerprint(const std::vector<MatrixModel>& models, uint32_t h) {
  std::vector<uint8_t> buf;
  for (const auto& m : models) {
    buf.clear();
    for (const auto& t : m.tables) t.serialize(buf);
    buf.insert(buf.end(), m.ids.begin(), m.ids.end());
    h = fnv1a(buf, h);
  }
  return h;
}

/// Checks training samples: at least one, one valid geometry, some tokens.
Status check_samples(std::span<const KvView> samples) {
  if (samples.empty()) return make_status(StatusCode::invalid_argument, "train: no samples");
  uint64_t tokens = 0;
  for (const auto& s : samples) {
    KVS_RETURN_IF_ERROR(s.geometry().validate());
    const auto& a = s.geometry();
    const auto& b = samples[0].geometry();
    if (a.layers != b.layers || a.planes() != b.planes() || a.channels() != b.channels())
      return make_status(StatusCode::invalid_argument, "train: samples have different geometries");
    tokens += s.tokens();
  }
  if (tokens == 0) return make_status(StatusCode::invalid_argument, "train: samples hold no tokens");
  return {};
}

/// Common part of the two trained codecs: geometry learned and checks.
struct TrainedShape {
  bool trained = false;
  uint32_t layers = 0, planes = 0, channels = 0;
  uint32_t fp = 0;

  Status check(const ChunkShape& s, const std::string& name) const {
    if (!trained)
      return make_status(StatusCode::invalid_argument, "{} is not trained: call train() with sample chunks first",
                         name);
    if (s.layers != layers || s.planes != planes || s.channels != channels)
      return make_status(StatusCode::invalid_argument,
                         "{} was trained on {} layers x {} planes x {} channels, chunk has {} x {} x {}", name, layers,
                         planes, channels, s.layers, s.planes, s.channels);
    return {};
  }
};

// ---------------------------------------------------------------------------------
// cachegen-code: header; u8 hi bins, u8 lo bins; then per (layer, plane) in order:
// tokens x fp16 absmax, then for each block of up to 256 channels: the block's
// FreqTables (one per channel, serialized, R = the largest |code| in that column of
// this chunk) followed by one coded rANS matrix (tokens x block channels).

class CachegenCodeCodec final : public BaselineCodec {
 public:
  CachegenCodeCodec(int hi, int lo) : hi_(hi), lo_(lo) {}
  std::string method() const override { return "cachegen-code"; }
  std::string config() const override { return fmt::format("bins{}-{}", hi_, lo_); }

  Result<std::vector<uint8_t>> encode(const KvView& chunk) const override {
    KVS_ASSIGN_OR_RETURN(const ChunkShape s, shape_of(chunk));
    std::vector<uint8_t> out;
    write_header(out, MethodId::cachegen_code, s);
    ByteWriter w(out);
    w.u8(uint8_t(hi_));
    w.u8(uint8_t(lo_));
    const uint32_t T = s.tokens, C = s.channels;
    if (T == 0) return out;
    std::vector<float> mat(size_t(T) * C);
    std::vector<int8_t> q(size_t(T) * C), block;
    std::vector<uint16_t> m(T);
    std::vector<uint64_t> hist;
    std::vector<uint8_t> ids;
    std::vector<FreqTable> tables;
    for (uint32_t l = 0; l < s.layers; ++l)
      for (uint32_t p = 0; p < s.planes; ++p) {
        load_matrix(chunk, l, p, mat.data());
        const int qmax = qmax_of_bins(cachegen_layer_bins(s.layers, l, p, hi_, lo_));
        quantize_tokens(mat.data(), T, C, qmax, q.data(), m.data());
        for (uint16_t v : m) w.u16(v);
        for (uint32_t c0 = 0; c0 < C; c0 += RANS_MAX_TABLES) {
          const uint32_t nc = std::min<uint32_t>(C - c0, RANS_MAX_TABLES);
          block.resize(size_t(T) * nc);
          for (uint32_t t = 0; t < T; ++t)
            std::copy_n(q.data() + size_t(t) * C + c0, nc, block.data() + size_t(t) * nc);
          hist.assign(size_t(nc) * kHist, 0);
          accumulate(block.data(), T, nc, hist);
          tables.clear();
          ids.resize(nc);
          for (uint32_t c = 0; c < nc; ++c) {
            const auto h = std::span<const uint64_t>(hist).subspan(size_t(c) * kHist, kHist);
            int r = 0;
            for (int v = -qmax; v <= qmax; ++v)
              if (h[size_t(v + 128)]) r = std::max(r, std::abs(v));
            KVS_ASSIGN_OR_RETURN(auto t, FreqTable::from_counts(h, r));
            t.serialize(out);
            tables.push_back(std::move(t));
            ids[c] = uint8_t(c);
          }
          KVS_ASSIGN_OR_RETURN(const auto rt, RansTables::build(tables));
          KVS_RETURN_IF_ERROR(rans_encode(rt, ids, block.data(), T, nc, out));
        }
      }
    return out;
  }

  Status decode(std::span<const uint8_t> bytes, const KvView& out) const override {
    ByteReader r(bytes);
    ChunkShape s;
    KVS_RETURN_IF_ERROR(read_header(r, MethodId::cachegen_code, out, &s));
    const uint8_t hi = r.u8(), lo = r.u8();
    if (!r.ok()) return corrupt("truncated parameters");
    if (hi != hi_ || lo != lo_) return corrupt("bins differ from the codec's");
    const uint32_t T = s.tokens, C = s.channels;
    std::vector<float> stage(s.elements());
    std::vector<int8_t> block;
    std::vector<uint16_t> m(T);
    std::vector<uint8_t> ids;
    std::vector<FreqTable> tables;
    size_t off = 0;
    for (uint32_t l = 0; l < s.layers && T > 0; ++l)
      for (uint32_t p = 0; p < s.planes; ++p, off += size_t(T) * C) {
        const int qmax = qmax_of_bins(cachegen_layer_bins(s.layers, l, p, hi_, lo_));
        KVS_RETURN_IF_ERROR(read_scales(r, T, m.data()));
        for (uint32_t c0 = 0; c0 < C; c0 += RANS_MAX_TABLES) {
          const uint32_t nc = std::min<uint32_t>(C - c0, RANS_MAX_TABLES);
          tables.clear();
          ids.resize(nc);
          for (uint32_t c = 0; c < nc; ++c) {
            size_t used = 0;
            auto t = FreqTable::deserialize(r.rest(), &used);
            if (!t.ok()) return t.status();
            r.skip(used);
            tables.push_back(std::move(t).value());
            ids[c] = uint8_t(c);
          }
          auto rt = RansTables::build(tables);
          if (!rt.ok()) return corrupt(rt.status().message());
          block.resize(size_t(T) * nc);
          KVS_RETURN_IF_ERROR(decode_matrix(r, *rt, ids, block.data(), T, nc, qmax));
          for (uint32_t t = 0; t < T; ++t) {
            const float mf = f16_to_f32(m[t]);
            float* row = stage.data() + off + size_t(t) * C + c0;
            for (uint32_t c = 0; c < nc; ++c) row[c] = dequant_sym(block[size_t(t) * nc + c], mf, qmax);
          }
        }
      }
    if (r.remaining() != 0) return corrupt("trailing bytes");
    store_all(out, s, stage);
    return {};
  }

 private:
  int hi_, lo_;
};

// ---------------------------------------------------------------------------------
// cachegen-static: header; u8 K bins, u8 V bins, u32 training fingerprint; then per
// (layer, plane): tokens x fp16 absmax and one coded rANS matrix (tokens x channels)
// under the trained tables (not shipped).

class CachegenStaticCodec final : public BaselineCodec {
 public:
  CachegenStaticCodec(int kb, int vb, int max_tables) : kb_(kb), vb_(vb), max_tables_(max_tables) {}
  std::string method() const override { return "cachegen-static"; }
  std::string config() const override {
    return vb_ ? fmt::format("kb{}-vb{}", kb_, vb_) : fmt::format("kb{}", kb_);
  }
  bool needs_training() const override { return true; }

  int qmax(uint32_t plane) const { return qmax_of_bins(plane == 0 ? kb_ : vb_); }

  Status train(std::span<const KvView> samples) override {
    KVS_RETURN_IF_ERROR(check_samples(samples));
    const KvGeometry& g = samples[0].geometry();
    if (g.planes() > 1 && vb_ == 0)
      return make_status(StatusCode::invalid_argument, "{} has no V setting for a two-plane cache", name());
    const uint32_t C = g.channels();
    std::vector<MatrixModel> models;
    std::vector<float> mat;
    std::vector<int8_t> q;
    std::vector<uint16_t> m;
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t p = 0; p < g.planes(); ++p) {
        std::vector<uint64_t> hist(size_t(C) * kHist, 0);
        for (const auto& sv : samples) {
          const uint32_t T = uint32_t(std::min<uint64_t>(sv.tokens(), UINT32_MAX));
          mat.resize(size_t(T) * C);
          q.resize(size_t(T) * C);
          m.resize(T);
          load_matrix(sv, l, p, mat.data());
          quantize_tokens(mat.data(), T, C, qmax(p), q.data(), m.data());
          accumulate(q.data(), T, C, hist);
        }
        KVS_ASSIGN_OR_RETURN(auto mm, build_model(std::move(hist), C, qmax(p), size_t(max_tables_)));
        models.push_back(std::move(mm));
      }
    models_ = std::move(models);
    shape_ = {true, g.layers, g.planes(), C, 0};
    shape_.fp = fingerprint(models_, 2166136261u ^ uint32_t(kb_ << 8 | vb_));
    return {};
  }

  Result<std::vector<uint8_t>> encode(const KvView& chunk) const override {
    KVS_ASSIGN_OR_RETURN(const ChunkShape s, shape_of(chunk));
    KVS_RETURN_IF_ERROR(shape_.check(s, name()));
    std::vector<uint8_t> out;
    write_header(out, MethodId::cachegen_static, s);
    ByteWriter w(out);
    w.u8(uint8_t(kb_));
    w.u8(uint8_t(vb_));
    w.u32(shape_.fp);
    const uint32_t T = s.tokens, C = s.channels;
    if (T == 0) return out;
    std::vector<float> mat(size_t(T) * C);
    std::vector<int8_t> q(size_t(T) * C);
    std::vector<uint16_t> m(T);
    for (uint32_t l = 0; l < s.layers; ++l)
      for (uint32_t p = 0; p < s.planes; ++p) {
        const MatrixModel& mm = models_[size_t(l) * s.planes + p];
        load_matrix(chunk, l, p, mat.data());
        quantize_tokens(mat.data(), T, C, qmax(p), q.data(), m.data());
        for (uint16_t v : m) w.u16(v);
        KVS_ASSIGN_OR_RETURN(const auto rt, RansTables::build(mm.tables));
        KVS_RETURN_IF_ERROR(rans_encode(rt, mm.ids, q.data(), T, C, out));
      }
    return out;
  }

  Status decode(std::span<const uint8_t> bytes, const KvView& out) const override {
    ByteReader r(bytes);
    ChunkShape s;
    KVS_RETURN_IF_ERROR(read_header(r, MethodId::cachegen_static, out, &s));
    KVS_RETURN_IF_ERROR(shape_.check(s, name()));
    const uint8_t kb = r.u8(), vb = r.u8();
    const uint32_t fp = r.u32();
    if (!r.ok()) return corrupt("truncated parameters");
    if (kb != kb_ || vb != vb_) return corrupt("bins differ from the codec's");
    if (fp != shape_.fp) return corrupt("object was coded with other trained tables (fingerprint mismatch)");
    const uint32_t T = s.tokens, C = s.channels;
    std::vector<float> stage(s.elements());
    std::vector<int8_t> q(size_t(T) * C);
    std::vector<uint16_t> m(T);
    size_t off = 0;
    for (uint32_t l = 0; l < s.layers && T > 0; ++l)
      for (uint32_t p = 0; p < s.planes; ++p, off += size_t(T) * C) {
        const MatrixModel& mm = models_[size_t(l) * s.planes + p];
        KVS_RETURN_IF_ERROR(read_scales(r, T, m.data()));
        KVS_ASSIGN_OR_RETURN(const auto rt, RansTables::build(mm.tables));
        KVS_RETURN_IF_ERROR(decode_matrix(r, rt, mm.ids, q.data(), T, C, qmax(p)));
        for (uint32_t t = 0; t < T; ++t) {
          const float mf = f16_to_f32(m[t]);
          for (uint32_t c = 0; c < C; ++c)
            stage[off + size_t(t) * C + c] = dequant_sym(q[size_t(t) * C + c], mf, qmax(p));
        }
      }
    if (r.remaining() != 0) return corrupt("trailing bytes");
    store_all(out, s, stage);
    return {};
  }

 private:
  int kb_, vb_, max_tables_;
  TrainedShape shape_;
  std::vector<MatrixModel> models_;  // [layer][plane]
};

// ---------------------------------------------------------------------------------
// cachegen-paper: header; u8 group, u8 K hi, K lo, V hi, V lo bins, u32 training
// fingerprint; then per (layer, plane): A fp16 anchor absmaxes, D fp16 delta
// absmaxes (A = ceil(T / group) anchors, D = T - A deltas), the coded anchor matrix
// (A x channels, if A > 0) and the coded delta matrix (D x channels, if D > 0).

class CachegenPaperCodec final : public BaselineCodec {
 public:
  CachegenPaperCodec(int group, int khi, int klo, int vhi, int vlo, int max_tables)
      : group_(group), khi_(khi), klo_(klo), vhi_(vhi), vlo_(vlo), max_tables_(max_tables) {}
  std::string method() const override { return "cachegen-paper"; }
  std::string config() const override {
    return vhi_ ? fmt::format("g{}-kb{}-{}-vb{}-{}", group_, khi_, klo_, vhi_, vlo_)
                : fmt::format("g{}-kb{}-{}", group_, khi_, klo_);
  }
  bool needs_training() const override { return true; }

  int qmax_delta(uint32_t layers, uint32_t l, uint32_t p) const {
    return qmax_of_bins(p == 0 ? cachegen_layer_bins(layers, l, p, khi_, klo_)
                               : cachegen_layer_bins(layers, l, p, vhi_, vlo_));
  }

  Status train(std::span<const KvView> samples) override {
    KVS_RETURN_IF_ERROR(check_samples(samples));
    const KvGeometry& g = samples[0].geometry();
    if (g.planes() > 1 && vhi_ == 0)
      return make_status(StatusCode::invalid_argument, "{} has no V setting for a two-plane cache", name());
    const uint32_t C = g.channels();
    std::vector<MatrixModel> models;  // [layer][plane][anchor, delta]
    std::vector<float> mat;
    std::vector<int8_t> qa, qd;
    std::vector<uint16_t> ma, md;
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t p = 0; p < g.planes(); ++p) {
        const int qd_max = qmax_delta(g.layers, l, p);
        std::vector<uint64_t> ha(size_t(C) * kHist, 0), hd(size_t(C) * kHist, 0);
        for (const auto& sv : samples) {
          const uint32_t T = uint32_t(std::min<uint64_t>(sv.tokens(), UINT32_MAX));
          const uint32_t A = anchor_rows(T, group_), D = T - A;
          mat.resize(size_t(T) * C);
          qa.resize(size_t(A) * C);
          qd.resize(size_t(D) * C);
          ma.resize(A);
          md.resize(D);
          load_matrix(sv, l, p, mat.data());
          paper_quantize(mat.data(), T, C, group_, qd_max, qa.data(), ma.data(), qd.data(), md.data());
          accumulate(qa.data(), A, C, ha);
          accumulate(qd.data(), D, C, hd);
        }
        KVS_ASSIGN_OR_RETURN(auto a, build_model(std::move(ha), C, kAnchorQmax, size_t(max_tables_)));
        KVS_ASSIGN_OR_RETURN(auto d, build_model(std::move(hd), C, qd_max, size_t(max_tables_)));
        models.push_back(std::move(a));
        models.push_back(std::move(d));
      }
    models_ = std::move(models);
    shape_ = {true, g.layers, g.planes(), C, 0};
    shape_.fp = fingerprint(models_, 2166136261u ^ uint32_t(group_ << 24 | khi_ << 16 | klo_ << 8 | vhi_) ^
                                         uint32_t(vlo_) << 4);
    return {};
  }

  Result<std::vector<uint8_t>> encode(const KvView& chunk) const override {
    KVS_ASSIGN_OR_RETURN(const ChunkShape s, shape_of(chunk));
    KVS_RETURN_IF_ERROR(shape_.check(s, name()));
    std::vector<uint8_t> out;
    write_header(out, MethodId::cachegen_paper, s);
    ByteWriter w(out);
    for (int v : {group_, khi_, klo_, vhi_, vlo_}) w.u8(uint8_t(v));
    w.u32(shape_.fp);
    const uint32_t T = s.tokens, C = s.channels, A = anchor_rows(T, group_), D = T - A;
    std::vector<float> mat(size_t(T) * C);
    std::vector<int8_t> qa(size_t(A) * C), qd(size_t(D) * C);
    std::vector<uint16_t> ma(A), md(D);
    for (uint32_t l = 0; l < s.layers && T > 0; ++l)
      for (uint32_t p = 0; p < s.planes; ++p) {
        const size_t mi = 2 * (size_t(l) * s.planes + p);
        load_matrix(chunk, l, p, mat.data());
        paper_quantize(mat.data(), T, C, group_, qmax_delta(s.layers, l, p), qa.data(), ma.data(), qd.data(),
                       md.data());
        for (uint16_t v : ma) w.u16(v);
        for (uint16_t v : md) w.u16(v);
        KVS_ASSIGN_OR_RETURN(const auto ra, RansTables::build(models_[mi].tables));
        KVS_RETURN_IF_ERROR(rans_encode(ra, models_[mi].ids, qa.data(), A, C, out));
        if (D > 0) {
          KVS_ASSIGN_OR_RETURN(const auto rd, RansTables::build(models_[mi + 1].tables));
          KVS_RETURN_IF_ERROR(rans_encode(rd, models_[mi + 1].ids, qd.data(), D, C, out));
        }
      }
    return out;
  }

  Status decode(std::span<const uint8_t> bytes, const KvView& out) const override {
    ByteReader r(bytes);
    ChunkShape s;
    KVS_RETURN_IF_ERROR(read_header(r, MethodId::cachegen_paper, out, &s));
    KVS_RETURN_IF_ERROR(shape_.check(s, name()));
    uint8_t prm[5];
    for (auto& v : prm) v = r.u8();
    const uint32_t fp = r.u32();
    if (!r.ok()) return corrupt("truncated parameters");
    if (prm[0] != group_ || prm[1] != khi_ || prm[2] != klo_ || prm[3] != vhi_ || prm[4] != vlo_)
      return corrupt("group or bins differ from the codec's");
    if (fp != shape_.fp) return corrupt("object was coded with other trained tables (fingerprint mismatch)");
    const uint32_t T = s.tokens, C = s.channels, A = anchor_rows(T, group_), D = T - A;
    std::vector<float> stage(s.elements());
    std::vector<int8_t> qa(size_t(A) * C), qd(size_t(D) * C);
    std::vector<uint16_t> ma(A), md(D);
    size_t off = 0;
    for (uint32_t l = 0; l < s.layers && T > 0; ++l)
      for (uint32_t p = 0; p < s.planes; ++p, off += size_t(T) * C) {
        const size_t mi = 2 * (size_t(l) * s.planes + p);
        const int qdm = qmax_delta(s.layers, l, p);
        KVS_RETURN_IF_ERROR(read_scales(r, A, ma.data()));
        KVS_RETURN_IF_ERROR(read_scales(r, D, md.data()));
        KVS_ASSIGN_OR_RETURN(const auto ra, RansTables::build(models_[mi].tables));
        KVS_RETURN_IF_ERROR(decode_matrix(r, ra, models_[mi].ids, qa.data(), A, C, kAnchorQmax));
        if (D > 0) {
          KVS_ASSIGN_OR_RETURN(const auto rd, RansTables::build(models_[mi + 1].tables));
          KVS_RETURN_IF_ERROR(decode_matrix(r, rd, models_[mi + 1].ids, qd.data(), D, C, qdm));
        }
        paper_dequantize(qa.data(), ma.data(), qd.data(), md.data(), T, C, group_, qdm, stage.data() + off);
      }
    if (r.remaining() != 0) return corrupt("trailing bytes");
    store_all(out, s, stage);
    return {};
  }

 private:
  int group_, khi_, klo_, vhi_, vlo_, max_tables_;
  TrainedShape shape_;
  std::vector<MatrixModel> models_;  // [layer][plane][anchor, delta]
};

int even_bins(int b) { return std::clamp(b & ~1, 4, 254); }

}  // namespace

std::unique_ptr<BaselineCodec> make_cachegen_code(int hi_bins, int lo_bins) {
  return std::make_unique<CachegenCodeCodec>(even_bins(hi_bins), even_bins(lo_bins));
}

std::unique_ptr<BaselineCodec> make_cachegen_static(int k_bins, int v_bins, int max_tables) {
  return std::make_unique<CachegenStaticCodec>(even_bins(k_bins), v_bins <= 0 ? 0 : even_bins(v_bins),
                                               std::clamp(max_tables, 1, int(RANS_MAX_TABLES)));
}

std::unique_ptr<BaselineCodec> make_cachegen_paper(int group, int k_hi, int k_lo, int v_hi, int v_lo,
                                                   int max_tables) {
  const bool single = v_hi <= 0 || v_lo <= 0;
  return std::make_unique<CachegenPaperCodec>(std::clamp(group, 1, 255), even_bins(k_hi), even_bins(k_lo),
                                              single ? 0 : even_bins(v_hi), single ? 0 : even_bins(v_lo),
                                              std::clamp(max_tables, 1, int(RANS_MAX_TABLES)));
}

}  // namespace kvstream::codec::baselines

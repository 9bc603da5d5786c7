// Forward pass of a llama2.c-format model, batched over the tokens of one call.
//
// Weight matrices are stored transposed ([in][out]) so that y = W x becomes a sum of
// rows of W^T scaled by x[i]: the inner loop runs over contiguous outputs and
// vectorises without reassociating any sum (results match a plain dot product order).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "examples/tinyllama/tinyllama.hpp"

namespace tinyllama {

using kvstream::make_status;
using kvstream::StatusCode;

namespace {

// y[t][o] = sum_i x[t][i] * wt[i][o]
void matmul_t(const float* x, const float* wt, float* y, int n, int in, int out) {
  for (int t = 0; t < n; ++t) {
    float* yr = y + size_t(t) * out;
    const float* xr = x + size_t(t) * in;
    std::fill(yr, yr + out, 0.0f);
    for (int i = 0; i < in; ++i) {
      const float xi = xr[i];
      const float* wr = wt + size_t(i) * out;
      for (int o = 0; o < out; ++o) yr[o] += xi * wr[o];
    }
  }
}

void rmsnorm(float* out, const float* x, const float* w, int size) {
  float ss = 0.0f;
  for (int j = 0; j < size; ++j) ss += x[j] * x[j];
  ss /= float(size);
  ss += 1e-5f;
  ss = 1.0f / std::sqrt(ss);
  for (int j = 0; j < size; ++j) out[j] = w[j] * (ss * x[j]);
}

void softmax(float* x, int size) {
  float mx = x[0];
  for (int i = 1; i < size; ++i) mx = std::max(mx, x[i]);
  float sum = 0.0f;
  for (int i = 0; i < size; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  for (int i = 0; i < size; ++i) x[i] /= sum;
}

}  // namespace

Result<Model> Model::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_status(StatusCode::not_found, "cannot open checkpoint '{}'", path);
  std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (raw.size() < 28) return make_status(StatusCode::corrupt_data, "checkpoint '{}' is {} bytes: no header", path, raw.size());
  int32_t h[7];
  std::memcpy(h, raw.data(), sizeof h);
  Model m;
  Config& c = m.cfg_;
  c.dim = h[0], c.hidden_dim = h[1], c.n_layers = h[2], c.n_heads = h[3], c.n_kv_heads = h[4];
  const bool shared_cls = h[5] > 0;
  c.vocab_size = std::abs(h[5]), c.seq_len = h[6];
  auto bad = [](int v, int hi) { return v <= 0 || v > hi; };
  if (bad(c.dim, 1 << 16) || bad(c.hidden_dim, 1 << 18) || bad(c.n_layers, 1024) || bad(c.n_heads, 1024) ||
      bad(c.n_kv_heads, 1024) || bad(c.vocab_size, 1 << 20) || bad(c.seq_len, 1 << 20) || c.dim % c.n_heads != 0 ||
      c.n_heads % c.n_kv_heads != 0 || c.head_size() % 2 != 0)
    return make_status(StatusCode::corrupt_data, "checkpoint '{}' has an impossible header {} {} {} {} {} {} {}", path,
                       h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
  const size_t L = c.n_layers, D = c.dim, H = c.hidden_dim, KV = c.kv_dim(), V = c.vocab_size;
  const size_t hs = c.head_size();
  size_t floats = V * D + L * D + L * D * D + 2 * L * KV * D + L * D * D + L * D + 3 * L * H * D + D +
                  size_t(c.seq_len) * hs;  // freq_cis real + imag: seq_len * hs/2 each
  if (!shared_cls) floats += V * D;
  if (raw.size() != 28 + floats * 4)
    return make_status(StatusCode::corrupt_data, "checkpoint '{}' is {} bytes; its header implies {}", path,
                       raw.size(), 28 + floats * 4);
  const float* src = reinterpret_cast<const float*>(raw.data() + 28);  // 28 is 4-aligned; vector data is 16-aligned
  std::vector<float> in(src, src + floats);
  const float* p = in.data();
  auto take = [&](size_t n) { const float* r = p; p += n; return r; };
  const float* emb = take(V * D);
  const float* rms_att = take(L * D);
  const float* wq = take(L * D * D);
  const float* wk = take(L * KV * D);
  const float* wv = take(L * KV * D);
  const float* wo = take(L * D * D);
  const float* rms_ffn = take(L * D);
  const float* w1 = take(L * H * D);
  const float* w2 = take(L * D * H);
  const float* w3 = take(L * H * D);
  const float* rms_final = take(D);
  take(size_t(c.seq_len) * hs);  // legacy freq_cis tables: recomputed below
  if (!shared_cls) return make_status(StatusCode::unsupported, "checkpoint '{}' has a separate classifier", path);

  // Layout of w_: emb, emb^T, rms_final, then per layer: rms_att, rms_ffn and transposed matrices.
  const size_t per_layer = 2 * D + D * D + 2 * KV * D + D * D + 3 * H * D;
  m.w_.resize(2 * V * D + D + L * per_layer);
  float* o = m.w_.data();
  auto put = [&](const float* s, size_t n) { std::memcpy(o, s, n * 4); float* r = o; o += n; return r; };
  auto put_t = [&](const float* s, size_t rows, size_t cols) {  // s is [rows][cols] -> [cols][rows]
    for (size_t r = 0; r < rows; ++r)
      for (size_t cc = 0; cc < cols; ++cc) o[cc * rows + r] = s[r * cols + cc];
    float* r = o;
    o += rows * cols;
    return r;
  };
  m.emb_ = put(emb, V * D);
  m.emb_t_ = put_t(emb, V, D);
  m.rms_final_ = put(rms_final, D);
  for (size_t l = 0; l < L; ++l) {
    Layer ly{};
    ly.rms_att = put(rms_att + l * D, D);
    ly.rms_ffn = put(rms_ffn + l * D, D);
    ly.wq = put_t(wq + l * D * D, D, D);
    ly.wk = put_t(wk + l * KV * D, KV, D);
    ly.wv = put_t(wv + l * KV * D, KV, D);
    ly.wo = put_t(wo + l * D * D, D, D);
    ly.w1 = put_t(w1 + l * H * D, H, D);
    ly.w2 = put_t(w2 + l * D * H, D, H);
    ly.w3 = put_t(w3 + l * H * D, H, D);
    m.layers_.push_back(ly);
  }
  // RoPE tables with llama2.c's formula (powf/cosf/sinf in fp32) so caches agree.
  m.rope_cos_.resize(size_t(c.seq_len) * hs / 2);
  m.rope_sin_.resize(m.rope_cos_.size());
  for (int pos = 0; pos < c.seq_len; ++pos)
    for (size_t i = 0; i < hs / 2; ++i) {
      const float freq = 1.0f / std::pow(10000.0f, float(2 * i) / float(hs));
      const float val = float(pos) * freq;
      m.rope_cos_[pos * hs / 2 + i] = std::cos(val);
      m.rope_sin_[pos * hs / 2 + i] = std::sin(val);
    }
  return m;
}

kvstream::KvGeometry Model::geometry() const noexcept {
  kvstream::KvGeometry g;
  g.layers = uint32_t(cfg_.n_layers);
  g.kv_heads = uint32_t(cfg_.n_kv_heads);
  g.head_dim = uint32_t(cfg_.head_size());
  g.q_heads = uint32_t(cfg_.n_heads);
  g.kind = cfg_.n_heads == cfg_.n_kv_heads ? kvstream::AttentionKind::mha : kvstream::AttentionKind::gqa;
  return g;
}

kvstream::RopeParams Model::rope() const noexcept {
  kvstream::RopeParams r;
  r.enabled = true;
  r.base = 10000.0f;
  r.rotary_dim = uint32_t(cfg_.head_size());
  r.pairing = kvstream::RopePairing::interleaved;
  return r;
}

State::State(const Model& m) : model_(&m) {
  const Config& c = m.config();
  const size_t cache = size_t(c.n_layers) * c.seq_len * c.kv_dim();
  key_.assign(cache, 0.0f);
  value_.assign(cache, 0.0f);
}

Status State::truncate(int n) {
  if (n < 0 || n > length_) return make_status(StatusCode::out_of_range, "truncate to {} of {} positions", n, length_);
  length_ = n;
  return {};
}

Status State::load_kv(const kvstream::KvView& kv) {
  const Config& c = model_->config();
  if (!(kv.geometry() == model_->geometry()))
    return make_status(StatusCode::invalid_argument, "KV cache geometry does not match the model");
  if (kv.first_position() != 0)
    return make_status(StatusCode::invalid_argument, "KV cache starts at position {}, not 0", kv.first_position());
  if (kv.tokens() > uint64_t(c.seq_len))
    return make_status(StatusCode::out_of_range, "KV cache of {} tokens exceeds seq_len {}", kv.tokens(), c.seq_len);
  const size_t kvd = c.kv_dim();
  for (int l = 0; l < c.n_layers; ++l)
    for (uint64_t t = 0; t < kv.tokens(); ++t) {
      kv.load_row(l, 0, t, &key_[(size_t(l) * c.seq_len + t) * kvd]);
      kv.load_row(l, 1, t, &value_[(size_t(l) * c.seq_len + t) * kvd]);
    }
  length_ = int(kv.tokens());
  return {};
}

Result<kvstream::KvCache> State::export_kv(int n) const {
  if (n < 0 || n > length_) return make_status(StatusCode::out_of_range, "export of {} of {} positions", n, length_);
  const Config& c = model_->config();
  KVS_ASSIGN_OR_RETURN(kvstream::KvCache kv, kvstream::KvCache::create(model_->geometry(), kvstream::DType::f32, n));
  kv.set_rope(model_->rope());
  const size_t kvd = c.kv_dim();
  const kvstream::KvView v = kv.view();
  for (int l = 0; l < c.n_layers; ++l)
    for (int t = 0; t < n; ++t) {
      v.store_row(l, 0, t, &key_[(size_t(l) * c.seq_len + t) * kvd]);
      v.store_row(l, 1, t, &value_[(size_t(l) * c.seq_len + t) * kvd]);
    }
  return kv;
}

void Model::layer_forward(State& st, int l, int n, int pos0) const {
  const Config& c = cfg_;
  const Layer& ly = layers_[l];
  const int D = c.dim, KV = c.kv_dim(), hs = c.head_size(), H = c.hidden_dim;
  const int group = c.n_heads / c.n_kv_heads;
  float* x = st.x_.data();
  float* xn = st.xn_.data();
  for (int t = 0; t < n; ++t) rmsnorm(xn + t * D, x + t * D, ly.rms_att, D);
  matmul_t(xn, ly.wq, st.q_.data(), n, D, D);
  matmul_t(xn, ly.wk, st.k_.data(), n, D, KV);
  matmul_t(xn, ly.wv, st.v_.data(), n, D, KV);
  float* kcache = st.key_.data() + size_t(l) * c.seq_len * KV;
  float* vcache = st.value_.data() + size_t(l) * c.seq_len * KV;
  for (int t = 0; t < n; ++t) {
    const int pos = pos0 + t;
    const float* cs = &rope_cos_[size_t(pos) * hs / 2];
    const float* sn = &rope_sin_[size_t(pos) * hs / 2];
    auto rotate = [&](float* vec, int width) {
      for (int i = 0; i < width; i += 2) {
        const int j = (i % hs) / 2;
        const float v0 = vec[i], v1 = vec[i + 1];
        vec[i] = v0 * cs[j] - v1 * sn[j];
        vec[i + 1] = v0 * sn[j] + v1 * cs[j];
      }
    };
    rotate(st.q_.data() + t * D, D);
    rotate(st.k_.data() + t * KV, KV);
    std::memcpy(kcache + size_t(pos) * KV, st.k_.data() + t * KV, KV * sizeof(float));
    std::memcpy(vcache + size_t(pos) * KV, st.v_.data() + t * KV, KV * sizeof(float));
  }
  const float scale = 1.0f / std::sqrt(float(hs));
  float* att = st.scores_.data();
  for (int t = 0; t < n; ++t) {
    const int pos = pos0 + t;
    for (int h = 0; h < c.n_heads; ++h) {
      const float* q = st.q_.data() + t * D + h * hs;
      const int kvh = h / group;
      for (int p = 0; p <= pos; ++p) {
        const float* k = kcache + size_t(p) * KV + kvh * hs;
        float s = 0.0f;
        for (int i = 0; i < hs; ++i) s += q[i] * k[i];
        att[p] = s * scale;
      }
      softmax(att, pos + 1);
      float* out = st.att_out_.data() + t * D + h * hs;
      std::fill(out, out + hs, 0.0f);
      for (int p = 0; p <= pos; ++p) {
        const float* v = vcache + size_t(p) * KV + kvh * hs;
        const float a = att[p];
        for (int i = 0; i < hs; ++i) out[i] += a * v[i];
      }
    }
  }
  matmul_t(st.att_out_.data(), ly.wo, st.tmp_.data(), n, D, D);
  for (int i = 0; i < n * D; ++i) x[i] += st.tmp_[i];
  for (int t = 0; t < n; ++t) rmsnorm(xn + t * D, x + t * D, ly.rms_ffn, D);
  matmul_t(xn, ly.w1, st.hb_.data(), n, D, H);
  matmul_t(xn, ly.w3, st.hb2_.data(), n, D, H);
  for (int i = 0; i < n * H; ++i) {
    float v = st.hb_[i];
    v *= 1.0f / (1.0f + std::exp(-v));
    st.hb_[i] = v * st.hb2_[i];
  }
  matmul_t(st.hb_.data(), ly.w2, st.tmp_.data(), n, H, D);
  for (int i = 0; i < n * D; ++i) x[i] += st.tmp_[i];
}

Status Model::forward(State& st, std::span<const int> tokens, std::span<float> logits) const {
  const Config& c = cfg_;
  const int n = int(tokens.size());
  if (st.model_ != this) return make_status(StatusCode::invalid_argument, "State belongs to another model");
  if (n == 0) return {};
  if (st.length_ + n > c.seq_len)
    return make_status(StatusCode::out_of_range, "{} + {} tokens exceed the model's context of {}", st.length_, n,
                       c.seq_len);
  for (int tok : tokens)
    if (tok < 0 || tok >= c.vocab_size)
      return make_status(StatusCode::invalid_argument, "token id {} outside the vocabulary [0, {})", tok, c.vocab_size);
  const bool last_only = logits.size() == size_t(c.vocab_size) && n > 1;
  if (!logits.empty() && !last_only && logits.size() != size_t(n) * c.vocab_size)
    return make_status(StatusCode::invalid_argument, "logits span of {} floats for {} tokens", logits.size(), n);
  const size_t D = c.dim;
  auto grow = [](std::vector<float>& v, size_t sz) { if (v.size() < sz) v.resize(sz); };
  grow(st.x_, n * D), grow(st.xn_, n * D), grow(st.q_, n * D), grow(st.att_out_, n * D), grow(st.tmp_, n * D);
  grow(st.k_, size_t(n) * c.kv_dim()), grow(st.v_, size_t(n) * c.kv_dim());
  grow(st.hb_, size_t(n) * c.hidden_dim), grow(st.hb2_, size_t(n) * c.hidden_dim);
  grow(st.scores_, c.seq_len);
  for (int t = 0; t < n; ++t) std::memcpy(&st.x_[t * D], emb_ + size_t(tokens[t]) * D, D * sizeof(float));
  const int pos0 = st.length_;
  for (int l = 0; l < c.n_layers; ++l) layer_forward(st, l, n, pos0);
  st.length_ += n;
  if (logits.empty()) return {};
  const int first = last_only ? n - 1 : 0;
  for (int t = first; t < n; ++t) rmsnorm(&st.xn_[t * D], &st.x_[t * D], rms_final_, int(D));
  matmul_t(&st.xn_[first * D], emb_t_, logits.data(), n - first, int(D), c.vocab_size);
  return {};
}

std::vector<float> Model::kv_sensitivity() const {
  const int D = cfg_.dim, KV = cfg_.kv_dim(), hs = cfg_.head_size(), group = cfg_.n_heads / cfg_.n_kv_heads;
  std::vector<float> w(size_t(cfg_.n_layers) * 2 * KV, 0.0f);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const Layer& ly = layers_[l];
    float* k = &w[size_t(l) * 2 * KV];
    float* v = k + KV;
    for (int j = 0; j < KV; ++j) {
      const int g = j / hs, d = j % hs;
      double e = 0;
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const int o = h * hs + d;  // query channel that multiplies K channel j
        for (int i = 0; i < D; ++i) {
          const double wq = ly.wq[size_t(i) * D + o] * ly.rms_att[i];  // wq stored transposed: [in][out]
          e += wq * wq;
        }
      }
      k[j] = float(e);
      double c = 0;
      for (int h = g * group; h < (g + 1) * group; ++h)
        for (int r = 0; r < D; ++r) {
          const double wo = ly.wo[size_t(h * hs + d) * D + r];  // column (h*hs+d) of wo
          c += wo * wo;
        }
      v[j] = float(c / group);
    }
    // RoPE mixes each (2i, 2i+1) pair across positions: give both the pair's mean.
    for (int j = 0; j + 1 < KV; j += 2) k[j] = k[j + 1] = 0.5f * (k[j] + k[j + 1]);
  }
  return w;
}

Result<kvstream::KvCache> Model::calculate_kv(std::span<const int> tokens) const {
  State st(*this);
  KVS_RETURN_IF_ERROR(forward(st, tokens, {}));
  return st.export_kv(int(tokens.size()));
}

namespace {
int argmax(std::span<const float> v) {
  return int(std::max_element(v.begin(), v.end()) - v.begin());
}
}  // namespace

Result<std::vector<int>> Model::generate_with_kv(const kvstream::KvView& kv, std::span<const int> tokens, int n) const {
  if (tokens.empty()) return make_status(StatusCode::invalid_argument, "generate needs at least one prompt token");
  if (kv.tokens() > tokens.size())
    return make_status(StatusCode::invalid_argument, "KV cache of {} tokens for a {}-token prompt", kv.tokens(),
                       tokens.size());
  if (n < 0) return make_status(StatusCode::invalid_argument, "negative step count {}", n);
  State st(*this);
  if (kv.tokens() > 0) {
    KVS_RETURN_IF_ERROR(st.load_kv(kv));
    // The last prompt position's logits start generation: recompute it against the cache.
    if (size_t(st.length()) == tokens.size()) KVS_RETURN_IF_ERROR(st.truncate(st.length() - 1));
  }
  std::vector<float> logits(cfg_.vocab_size);
  KVS_RETURN_IF_ERROR(forward(st, tokens.subspan(st.length()), logits));
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    const int next = argmax(logits);
    if (next == kBos) break;
    out.push_back(next);
    if (i + 1 == n || st.length() >= cfg_.seq_len) break;
    const int tok[1] = {next};
    KVS_RETURN_IF_ERROR(forward(st, tok, logits));
  }
  return out;
}

Result<std::vector<int>> Model::generate(std::span<const int> tokens, int n) const {
  return generate_with_kv(kvstream::KvView{}, tokens, n);
}

}  // namespace tinyllama

// Static-table interleaved rANS decoders: scalar, AVX2 and AVX-512 kernels, one
// stream at a time or several interleaved. See rans.hpp for the format and
// docs/entropy-coding.md for the design and measurements.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "codec/entropy/rans.hpp"
#include "codec/entropy/rans_format.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvstream::codec {

using namespace rans_format;

namespace {

// Widest matrix whose per-lane table offsets the interleaved AVX-512 kernel
// precomputes (on the stack); wider ones get theirs at every step.
constexpr size_t kGroupMaxCols = 1024;

// Everything one decode call needs; kernels advance step/c0/wp/state.
struct DecodeCtx {
  const uint32_t* dec;      // decode tables
  const uint8_t* tid;       // table id per column
  size_t cols;
  size_t n_mod;             // RANS_LANES mod cols
  int8_t* out;
  size_t full_steps;        // steps where all lanes carry a symbol
  size_t step = 0;          // next step to decode
  size_t c0 = 0;            // column of lane 0 at `step`
  const uint8_t* wp;        // next word
  const uint8_t* wend;      // end of the word stream (>= kStepWordBytes readable beyond)
  bool escape_seen = false;
  alignas(64) uint32_t state[kLanes];
};

inline void advance_column(DecodeCtx& c) {
  c.c0 += c.n_mod;
  if (c.c0 >= c.cols) c.c0 -= c.cols;
}

// Table ids of the 32 lanes for the current step: a pointer into table_of_col when
// they are contiguous (always, when cols is a multiple of 32), else gathered with
// wrap-around into `tmp`.
inline const uint8_t* step_ids(const DecodeCtx& c, uint8_t* tmp) {
  if (c.c0 + kLanes <= c.cols) return c.tid + c.c0;
  size_t col = c.c0;
  for (int l = 0; l < kLanes; ++l) {
    tmp[l] = c.tid[col];
    if (++col == c.cols) col = 0;
  }
  return tmp;
}

// One scalar step over lanes [0, lanes). Caller guarantees wp <= wend, so the up to
// 64 bytes read here are in bounds (the states trailer follows the words).
inline void scalar_step(DecodeCtx& c, int lanes) {
  int8_t* out = c.out + c.step * kLanes;
  size_t col = c.c0;
  const uint8_t* wp = c.wp;
  uint8_t esc = 0;
  for (int l = 0; l < lanes; ++l) {
    uint32_t x = c.state[l];
    const uint32_t e = c.dec[(size_t(c.tid[col]) << PROB_BITS) + (x & kProbMask)];
    out[l] = int8_t(uint8_t(e));
    esc |= uint8_t(uint8_t(e) == kEscapeByte);
    x = (e >> (8 + PROB_BITS)) * (x >> PROB_BITS) + ((e >> 8) & kProbMask);
    const bool need = x < kStateLow;
    const uint32_t w = load_u16(wp);
    c.state[l] = need ? (x << 16) | w : x;
    wp += need ? 2 : 0;
    if (++col == c.cols) col = 0;
  }
  c.wp = wp;
  c.escape_seen |= esc != 0;
  advance_column(c);
  ++c.step;
}

void decode_full_steps_scalar(DecodeCtx& c) {
  while (c.step < c.full_steps && c.wp <= c.wend) scalar_step(c, kLanes);
}

#if defined(__x86_64__)

// Four decode-table entries, at[0..3], by scalar loads inserted into one xmm register.
// The kernels read table entries this way rather than with vpgatherdd: the gather
// is microcoded on AMD Zen 4/5 and slowed by the Gather Data Sampling mitigation on
// Intel cores from Skylake to Ice Lake, while scalar loads have three ports (on the
// Zen 5 VM the interleaved AVX-512 kernel went from 2.06 to 2.8 G symbols/s this
// way; docs/entropy-coding.md). Inserting, not storing the entries and reloading
// them as a vector, avoids a store-forwarding stall.
__attribute__((target("sse4.1"))) inline __m128i load_entries4(const uint32_t* dec, const uint32_t* at) {
  __m128i v = _mm_cvtsi32_si128(int(dec[at[0]]));
  v = _mm_insert_epi32(v, int(dec[at[1]]), 1);
  v = _mm_insert_epi32(v, int(dec[at[2]]), 2);
  return _mm_insert_epi32(v, int(dec[at[3]]), 3);
}

// Lane permutation for the AVX2 renormalization: for an 8-bit "lane needs a word"
// mask, entry[i] is the rank of lane i among the needing lanes, i.e. which of the
// next words it takes.
struct ExpandTable {
  alignas(64) uint8_t idx[256][8];
  constexpr ExpandTable() : idx{} {
    for (int m = 0; m < 256; ++m) {
      int rank = 0;
      for (int i = 0; i < 8; ++i)
        if (m & (1 << i)) idx[m][i] = uint8_t(rank++);
    }
  }
};
constexpr ExpandTable kExpand;

// Decodes 8 lanes of one step: load the slot entries, update the states, write the
// 8 symbols, and refill the states that dropped below 2^16 from consecutive words.
__attribute__((target("avx2,popcnt"))) inline __m256i avx2_lanes8(__m256i x, const uint8_t* ids, const uint32_t* dec,
                                                                   int8_t* out, const uint8_t*& wp, __m128i& esc) {
  const __m256i pmask = _mm256_set1_epi32(int(kProbMask));
  const __m256i base = _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)ids)), PROB_BITS);
  alignas(32) uint32_t at[8];
  _mm256_store_si256((__m256i*)at, _mm256_add_epi32(base, _mm256_and_si256(x, pmask)));
  const __m256i e = _mm256_set_m128i(load_entries4(dec, at + 4), load_entries4(dec, at));
  const __m256i freq = _mm256_srli_epi32(e, 8 + PROB_BITS);
  const __m256i bias = _mm256_and_si256(_mm256_srli_epi32(e, 8), pmask);
  x = _mm256_add_epi32(_mm256_mullo_epi32(freq, _mm256_srli_epi32(x, PROB_BITS)), bias);

  // Low byte of each 32-bit entry -> 8 consecutive bytes.
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                                        -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i b = _mm256_shuffle_epi8(e, pick);
  const __m128i sym = _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  _mm_storel_epi64((__m128i*)out, sym);
  esc = _mm_or_si128(esc, _mm_cmpeq_epi8(sym, _mm_set1_epi8(char(kEscapeByte))));

  const __m256i need = _mm256_cmpeq_epi32(_mm256_srli_epi32(x, 16), _mm256_setzero_si256());
  const unsigned m = unsigned(_mm256_movemask_ps(_mm256_castsi256_ps(need)));
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)wp));
  w = _mm256_permutevar8x32_epi32(w, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)kExpand.idx[m])));
  x = _mm256_blendv_epi8(x, _mm256_or_si256(_mm256_slli_epi32(x, 16), w), need);
  wp += 2 * __builtin_popcount(m);
  return x;
}

__attribute__((target("avx2,popcnt"))) void decode_full_steps_avx2(DecodeCtx& c) {
  __m256i x0 = _mm256_load_si256((const __m256i*)&c.state[0]);
  __m256i x1 = _mm256_load_si256((const __m256i*)&c.state[8]);
  __m256i x2 = _mm256_load_si256((const __m256i*)&c.state[16]);
  __m256i x3 = _mm256_load_si256((const __m256i*)&c.state[24]);
  __m128i esc = _mm_setzero_si128();
  const uint8_t* wp = c.wp;
  alignas(32) uint8_t tmp[kLanes];
  while (c.step < c.full_steps && wp <= c.wend) {
    const uint8_t* ids = step_ids(c, tmp);
    int8_t* out = c.out + c.step * kLanes;
    x0 = avx2_lanes8(x0, ids, c.dec, out, wp, esc);
    x1 = avx2_lanes8(x1, ids + 8, c.dec, out + 8, wp, esc);
    x2 = avx2_lanes8(x2, ids + 16, c.dec, out + 16, wp, esc);
    x3 = avx2_lanes8(x3, ids + 24, c.dec, out + 24, wp, esc);
    advance_column(c);
    ++c.step;
  }
  _mm256_store_si256((__m256i*)&c.state[0], x0);
  _mm256_store_si256((__m256i*)&c.state[8], x1);
  _mm256_store_si256((__m256i*)&c.state[16], x2);
  _mm256_store_si256((__m256i*)&c.state[24], x3);
  c.wp = wp;
  c.escape_seen |= !_mm_testz_si128(esc, esc);
}

// AVX2 version of decode_group_avx512 (two streams: their 8 state vectors and the
// temporaries fill the 16 registers); each stream decodes `steps` more full steps.
__attribute__((target("avx2,popcnt"))) void decode_group2_avx2(DecodeCtx* const* cs, size_t steps) {
  __m256i x[2][4];
  __m128i esc[2];
  const uint8_t* wp[2];
  for (int k = 0; k < 2; ++k) {
    for (int v = 0; v < 4; ++v) x[k][v] = _mm256_load_si256((const __m256i*)&cs[k]->state[8 * v]);
    esc[k] = _mm_setzero_si128();
    wp[k] = cs[k]->wp;
  }
  alignas(32) uint8_t tmp[2][kLanes];
  size_t done = 0;
  for (; done < steps && wp[0] <= cs[0]->wend && wp[1] <= cs[1]->wend; ++done) {
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k) {
      DecodeCtx& c = *cs[k];
      const uint8_t* ids = step_ids(c, tmp[k]);
      int8_t* out = c.out + (c.step + done) * kLanes;
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) x[k][v] = avx2_lanes8(x[k][v], ids + 8 * v, c.dec, out + 8 * v, wp[k], esc[k]);
      advance_column(c);
    }
  }
  for (int k = 0; k < 2; ++k) {
    for (int v = 0; v < 4; ++v) _mm256_store_si256((__m256i*)&cs[k]->state[8 * v], x[k][v]);
    cs[k]->wp = wp[k];
    cs[k]->step += done;
    cs[k]->escape_seen |= !_mm_testz_si128(esc[k], esc[k]);
  }
}

// GCC 12 warns falsely inside its own AVX-512 headers (_mm512_undefined_epi32, GCC
// bug 105593); the warning says nothing about this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// The 16 decode-table entries at `slots` (see load_entries4).
__attribute__((target("avx512f"))) inline __m512i load_entries16(const uint32_t* dec, __m512i slots) {
  alignas(64) uint32_t at[16];
  _mm512_store_si512(at, slots);
  const __m256i lo = _mm256_set_m128i(load_entries4(dec, at + 4), load_entries4(dec, at));
  const __m256i hi = _mm256_set_m128i(load_entries4(dec, at + 12), load_entries4(dec, at + 8));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// AVX-512 version of avx2_lanes8 for 16 lanes, given each lane's decode-table offset
// (table id << PROB_BITS); the refill uses vpexpandd. kEscapes: whether to note escape
// symbols in `esc` (the interleaved kernels leave that to one scan of the output).
template <bool kEscapes = true>
__attribute__((target("avx512f,popcnt"))) inline __m512i avx512_lanes16_based(__m512i x, __m512i base,
                                                                               const uint32_t* dec, int8_t* out,
                                                                               const uint8_t*& wp, __m128i& esc) {
  const __m512i pmask = _mm512_set1_epi32(int(kProbMask));
  const __m512i e = load_entries16(dec, _mm512_add_epi32(base, _mm512_and_si512(x, pmask)));
  const __m512i freq = _mm512_srli_epi32(e, 8 + PROB_BITS);
  const __m512i bias = _mm512_and_si512(_mm512_srli_epi32(e, 8), pmask);
  x = _mm512_add_epi32(_mm512_mullo_epi32(freq, _mm512_srli_epi32(x, PROB_BITS)), bias);

  const __m128i sym = _mm512_cvtepi32_epi8(e);  // truncation keeps the symbol byte
  _mm_storeu_si128((__m128i*)out, sym);
  if constexpr (kEscapes) esc = _mm_or_si128(esc, _mm_cmpeq_epi8(sym, _mm_set1_epi8(char(kEscapeByte))));

  const __mmask16 need = _mm512_cmplt_epu32_mask(x, _mm512_set1_epi32(int(kStateLow)));
  const __m512i w = _mm512_maskz_expand_epi32(need, _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)wp)));
  x = _mm512_mask_or_epi32(x, need, _mm512_slli_epi32(x, 16), w);
  wp += 2 * __builtin_popcount(unsigned(need));
  return x;
}

// The decode-table offsets (table id << PROB_BITS) of 16 lanes from their table ids.
__attribute__((target("avx512f"))) inline __m512i lane_offsets16(const uint8_t* ids) {
  return _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)ids)), PROB_BITS);
}

__attribute__((target("avx512f,popcnt"))) inline __m512i avx512_lanes16(__m512i x, const uint8_t* ids,
                                                                         const uint32_t* dec, int8_t* out,
                                                                         const uint8_t*& wp, __m128i& esc) {
  return avx512_lanes16_based(x, lane_offsets16(ids), dec, out, wp, esc);
}

__attribute__((target("avx512f,popcnt"))) void decode_full_steps_avx512(DecodeCtx& c) {
  __m512i x0 = _mm512_load_si512(&c.state[0]);
  __m512i x1 = _mm512_load_si512(&c.state[16]);
  __m128i esc = _mm_setzero_si128();
  const uint8_t* wp = c.wp;
  alignas(64) uint8_t tmp[kLanes];
  while (c.step < c.full_steps && wp <= c.wend) {
    const uint8_t* ids = step_ids(c, tmp);
    int8_t* out = c.out + c.step * kLanes;
    x0 = avx512_lanes16(x0, ids, c.dec, out, wp, esc);
    x1 = avx512_lanes16(x1, ids + 16, c.dec, out + 16, wp, esc);
    advance_column(c);
    ++c.step;
  }
  _mm512_store_si512(&c.state[0], x0);
  _mm512_store_si512(&c.state[16], x1);
  c.wp = wp;
  c.escape_seen |= !_mm_testz_si128(esc, esc);
}

// K streams at once: one stream's step is a chain of dependent latencies (loads,
// multiply, refill), so a single stream leaves the core idle most of each step;
// independent streams fill those gaps. Each stream, from wherever it is, decodes
// `steps` more full steps (all have that many left), unless one overruns its words.
// Everything a step reads lives in local arrays, not in the DecodeCtx: the symbol
// stores (int8_t) may alias any memory the compiler cannot prove private, so fields
// read through the contexts would be reloaded at every step (9% slower, measured).
template <int K, bool kWide>
__attribute__((target("avx512f,popcnt"))) void decode_group_avx512(DecodeCtx* const* cs, size_t steps) {
  static_assert(K >= 2 && K <= 4);  // 2K state vectors and the temporaries fit the 32 registers
  // Columns are a multiple of 32 (see group_fits), so a step's lanes are columns
  // c0 .. c0 + 31 and cycle through cols / 32 positions. Up to kGroupMaxCols columns,
  // each lane's table offset per position is computed once here instead of at every
  // step (3.1 against 2.5 G symbols/s for 32 columns); wider matrices (a 7B MHA
  // plane has 4096) compute it at every step from the table ids, which still beats
  // decoding them one at a time (2.6 against 1.75).
  const size_t positions = cs[0]->cols / kLanes;
  alignas(64) uint32_t base[K][kWide ? 1 : kGroupMaxCols];
  size_t pos[K];
  int8_t* out[K];
  const uint8_t* wp[K];
  const uint8_t* wend[K];
  const uint32_t* const dec = cs[0]->dec;  // one RansTables per call: every stream shares it
  const uint8_t* tid[K];
  __m512i xa[K], xb[K];
#pragma GCC unroll 4
  for (int k = 0; k < K; ++k) {
    const DecodeCtx& c = *cs[k];
    if constexpr (!kWide)
      for (size_t col = 0; col < c.cols; ++col) base[k][col] = uint32_t(c.tid[col]) << PROB_BITS;
    pos[k] = c.c0 / kLanes, out[k] = c.out + c.step * kLanes;
    wp[k] = c.wp, wend[k] = c.wend, tid[k] = c.tid;
    xa[k] = _mm512_load_si512(&c.state[0]), xb[k] = _mm512_load_si512(&c.state[16]);
  }
  __m128i no_escapes = _mm_setzero_si128();  // not tracked here: finish_job scans the output
  size_t done = 0;
  for (; done < steps; ++done) {
    bool in = true;
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) in &= wp[k] <= wend[k];
    if (!in) break;
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) {
      __m512i ba, bb;
      if constexpr (kWide) {
        ba = lane_offsets16(tid[k] + pos[k] * kLanes);
        bb = lane_offsets16(tid[k] + pos[k] * kLanes + 16);
      } else {
        ba = _mm512_load_si512(&base[k][pos[k] * kLanes]);
        bb = _mm512_load_si512(&base[k][pos[k] * kLanes + 16]);
      }
      xa[k] = avx512_lanes16_based<false>(xa[k], ba, dec, out[k], wp[k], no_escapes);
      xb[k] = avx512_lanes16_based<false>(xb[k], bb, dec, out[k] + 16, wp[k], no_escapes);
      out[k] += kLanes;
      if (++pos[k] == positions) pos[k] = 0;
    }
  }
#pragma GCC unroll 4
  for (int k = 0; k < K; ++k) {
    DecodeCtx& c = *cs[k];
    _mm512_store_si512(&c.state[0], xa[k]), _mm512_store_si512(&c.state[16], xb[k]);
    c.wp = wp[k], c.step += done, c.c0 = pos[k] * kLanes;
    c.escape_seen = true;  // finish_job scans
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt"); }
bool cpu_has_avx512() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("popcnt"); }

#else
bool cpu_has_avx2() { return false; }
bool cpu_has_avx512() { return false; }
#endif

using KernelFn = void (*)(DecodeCtx&);

KernelFn kernel_for(RansPath path) {
#if defined(__x86_64__)
  if (path == RansPath::avx512) return decode_full_steps_avx512;
  if (path == RansPath::avx2) return decode_full_steps_avx2;
#endif
  (void)path;
  return decode_full_steps_scalar;
}

// Replaces every escape marker in out[0, n) with the next raw byte, in order.
Status patch_escapes(int8_t* out, size_t n, const uint8_t* raw, size_t n_raw) {
  size_t used = 0;
  auto* p = reinterpret_cast<uint8_t*>(out);
  auto* end = p + n;
  while (true) {
    p = static_cast<uint8_t*>(std::memchr(p, kEscapeByte, size_t(end - p)));
    if (p == nullptr) break;
    if (used == n_raw) return make_status(StatusCode::corrupt_data, "rans: more escapes than raw values");
    *p++ = raw[used++];
  }
  if (used != n_raw) return make_status(StatusCode::corrupt_data, "rans: {} raw values, {} escapes", n_raw, used);
  return {};
}

struct StreamLayout {
  size_t total;
  size_t n_words;
  size_t n_escapes;
};

Result<StreamLayout> parse_header(std::span<const uint8_t> in) {
  if (in.size() < kHeaderBytes) return make_status(StatusCode::corrupt_data, "rans: truncated header");
  if (in[0] != kStreamVersion || in[1] != kLanes || in[2] != PROB_BITS || in[3] != 0)
    return make_status(StatusCode::corrupt_data, "rans: bad header {:02x} {:02x} {:02x} {:02x}", in[0], in[1], in[2],
                       in[3]);
  StreamLayout s;
  s.n_words = load_u32(&in[4]);
  s.n_escapes = load_u32(&in[8]);
  s.total = kHeaderBytes + 2 * s.n_words + s.n_escapes + kStateBytes;  // no overflow: < 2^35
  return s;
}

// Opens one job: validates its shape (and table ids, unless they are not written yet)
// and header, and loads its start states.
Status open_job(const RansTables& tables, const RansJob& job, DecodeCtx& c, StreamLayout& s, size_t& n,
                bool check_ids = true) {
  KVS_RETURN_IF_ERROR(rans_check_shape(tables, job.table_of_col, job.rows, job.cols, n, check_ids));
  if (n != 0 && job.symbols_out == nullptr) return make_status(StatusCode::invalid_argument, "null output");
  KVS_ASSIGN_OR_RETURN(s, parse_header(job.in));
  if (s.total != job.in.size())
    return make_status(StatusCode::corrupt_data, "rans: {} bytes, header says {}", job.in.size(), s.total);
  if (s.n_words > n || s.n_escapes > n)
    return make_status(StatusCode::corrupt_data, "rans: {} words / {} escapes for {} symbols", s.n_words,
                       s.n_escapes, n);
  c.dec = tables.decode_table();
  c.tid = job.table_of_col.data();
  c.cols = job.cols;
  c.n_mod = job.cols == 0 ? 0 : kLanes % job.cols;
  c.out = job.symbols_out;
  c.full_steps = n / kLanes;
  c.wp = job.in.data() + kHeaderBytes;
  c.wend = c.wp + 2 * s.n_words;
  const uint8_t* states = c.wend + s.n_escapes;
  for (int l = 0; l < kLanes; ++l) {
    c.state[l] = load_u32(states + 4 * l);
    if (c.state[l] < kStateLow) return make_status(StatusCode::corrupt_data, "rans: lane {} start state too low", l);
  }
  return {};
}

// Finishes one job after the kernels: the steps they left (all of them, for a stream
// that overran), the partial last step, and the checks that the stream was whole.
Status finish_job(DecodeCtx& c, const StreamLayout& s, size_t n, KernelFn kernel) {
  if (n != 0) {
    if (c.step < c.full_steps) kernel(c);
    // A kernel stops early only when a corrupt stream overran the words.
    if (c.step < c.full_steps || c.wp > c.wend)
      return make_status(StatusCode::corrupt_data, "rans: word stream overrun");
    if (const int rest = int(n - c.full_steps * kLanes); rest != 0) scalar_step(c, rest);
  }
  if (c.wp != c.wend)
    return make_status(StatusCode::corrupt_data, "rans: {} word bytes left over", c.wend - c.wp);
  for (int l = 0; l < kLanes; ++l)
    if (c.state[l] != kStateLow)
      return make_status(StatusCode::corrupt_data, "rans: lane {} did not return to its initial state", l);
  if (c.escape_seen || s.n_escapes != 0) KVS_RETURN_IF_ERROR(patch_escapes(c.out, n, c.wend, s.n_escapes));
  return {};
}

// Runs the interleaved kernel of `path`: each of the k streams decodes `steps` more
// full steps. `ids_ahead`: the streams' table ids past this call's steps may not be
// written yet (rans_decode_chain), so the AVX-512 kernel must not precompute them.
void run_group(DecodeCtx* const* cs, int k, size_t steps, RansPath path, bool ids_ahead = false) {
#if defined(__x86_64__)
  if (path == RansPath::avx512) {
    const bool wide = ids_ahead || cs[0]->cols > kGroupMaxCols;  // a group shares its column count
    if (k == 4) return wide ? decode_group_avx512<4, true>(cs, steps) : decode_group_avx512<4, false>(cs, steps);
    if (k == 3) return wide ? decode_group_avx512<3, true>(cs, steps) : decode_group_avx512<3, false>(cs, steps);
    if (k == 2) return wide ? decode_group_avx512<2, true>(cs, steps) : decode_group_avx512<2, false>(cs, steps);
  }
  if (path == RansPath::avx2 && k == 2) return decode_group2_avx2(cs, steps);
#endif
  (void)cs, (void)k, (void)steps, (void)path, (void)ids_ahead;
}

// Whether a stream can join an interleaved group on `path`.
bool group_fits(const DecodeCtx& c, RansPath path) {
  if (path == RansPath::avx512) return c.cols % kLanes == 0;
  return true;
}

// How many streams one interleaved kernel takes on `path`.
int group_width(RansPath path) {
  if (path == RansPath::avx512) return 4;
  if (path == RansPath::avx2) return 2;
  return 1;
}

}  // namespace

Result<size_t> rans_coded_size(std::span<const uint8_t> in) {
  KVS_ASSIGN_OR_RETURN(const StreamLayout s, parse_header(in));
  return s.total;
}

bool rans_path_available(RansPath path) noexcept {
  switch (path) {
    case RansPath::automatic:
    case RansPath::scalar: return true;
    case RansPath::avx2: return cpu_has_avx2();
    case RansPath::avx512: return cpu_has_avx512();
  }
  return false;
}

RansPath rans_best_path() noexcept {
  static const RansPath best = cpu_has_avx512() ? RansPath::avx512
                               : cpu_has_avx2() ? RansPath::avx2
                                                : RansPath::scalar;
  return best;
}

const char* rans_path_name(RansPath path) noexcept {
  switch (path) {
    case RansPath::automatic: return "automatic";
    case RansPath::scalar: return "scalar";
    case RansPath::avx2: return "avx2";
    case RansPath::avx512: return "avx512";
  }
  return "?";
}

Status rans_decode_group(const RansTables& tables, std::span<const RansJob> jobs, RansPath path) {
  if (path == RansPath::automatic) path = rans_best_path();
  if (!rans_path_available(path))
    return make_status(StatusCode::unsupported, "rans: {} decoder not available on this CPU", rans_path_name(path));
  constexpr size_t kMaxGroup = 16;  // jobs per call: the contexts live on the stack
  if (jobs.size() > kMaxGroup)
    return make_status(StatusCode::invalid_argument, "rans: {} jobs in one group, at most {}", jobs.size(), kMaxGroup);
  DecodeCtx ctx[kMaxGroup];
  StreamLayout layout[kMaxGroup];
  size_t n[kMaxGroup];
  for (size_t j = 0; j < jobs.size(); ++j) {
    Status st = open_job(tables, jobs[j], ctx[j], layout[j], n[j]);
    if (!st.ok()) return st.with_context(fmt::format("job {}", j));
  }
  // Interleave the streams, up to the kernel's width at a time: the unfinished streams
  // with the most steps left (of one column count) run together for as many steps as
  // the shortest of them has left, and the rest go on in the next round. A stream the
  // kernel stopped early (a corrupt one overran its words) is left to finish_job.
  const int width = group_width(path);
  bool stuck[kMaxGroup] = {};
  auto left = [&](size_t j) { return ctx[j].full_steps - ctx[j].step; };
  while (width > 1) {
    size_t order[kMaxGroup];
    size_t m = 0;
    for (size_t j = 0; j < jobs.size(); ++j)
      if (!stuck[j] && left(j) > 0 && group_fits(ctx[j], path)) order[m++] = j;
    std::sort(order, order + m, [&](size_t a, size_t b) { return left(a) > left(b) || (left(a) == left(b) && a < b); });
    // The group of the longest stream that has a partner of its column count (a
    // longest stream alone in its column count must not keep the others apart).
    DecodeCtx* group[4];
    size_t before[4];
    int k = 0;
    for (size_t lead = 0; lead < m && k < 2; ++lead) {
      k = 0;
      for (size_t i = lead; i < m && k < width; ++i)
        if (k == 0 || ctx[order[i]].cols == group[0]->cols) before[k] = ctx[order[i]].step, group[k++] = &ctx[order[i]];
    }
    if (k < 2) break;
    const size_t steps = left(size_t(group[k - 1] - ctx));  // the shortest: sorted by steps left
    run_group(group, k, steps, path);
    for (int i = 0; i < k; ++i)
      if (group[i]->step - before[i] < steps) stuck[size_t(group[i] - ctx)] = true;
  }
  const KernelFn kernel = kernel_for(path);
  for (size_t j = 0; j < jobs.size(); ++j) {
    Status st = finish_job(ctx[j], layout[j], n[j], kernel);
    if (!st.ok()) return jobs.size() == 1 ? st : st.with_context(fmt::format("job {}", j));
  }
  return {};
}

Status rans_decode_chain(const RansTables& tables, std::span<const RansJob> jobs, size_t block,
                         const RansChainHook& hook, RansPath path) {
  if (path == RansPath::automatic) path = rans_best_path();
  if (!rans_path_available(path))
    return make_status(StatusCode::unsupported, "rans: {} decoder not available on this CPU", rans_path_name(path));
  constexpr size_t kMaxChain = 16;  // the contexts live on the stack
  if (jobs.size() > kMaxChain)
    return make_status(StatusCode::invalid_argument, "rans: {} jobs in one chain, at most {}", jobs.size(), kMaxChain);
  if (jobs.empty()) return {};
  const size_t N = jobs[0].cols;
  DecodeCtx ctx[kMaxChain];
  StreamLayout layout[kMaxChain];
  size_t n[kMaxChain];
  bool escapes = false;
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (jobs[j].rows != 1 || jobs[j].cols != N)
      return make_status(StatusCode::invalid_argument, "rans: chained job {} is {} x {}, not 1 x {}", j, jobs[j].rows,
                         jobs[j].cols, N);
    Status st = open_job(tables, jobs[j], ctx[j], layout[j], n[j], false);
    if (!st.ok()) return st.with_context(fmt::format("job {}", j));
    escapes |= layout[j].n_escapes != 0;
  }
  const KernelFn kernel = kernel_for(path);
  auto failed = [&](size_t j, Status st) { return jobs.size() == 1 ? st : st.with_context(fmt::format("job {}", j)); };
  auto prepare = [&](size_t j, size_t begin, size_t end) {
    hook(j, begin, end, false);
    return rans_check_ids(tables, jobs[j].table_of_col.subspan(begin, end - begin), begin);
  };
  // The single-stream kernel, stopped at step `target` rather than at the stream's end.
  auto run_until = [&](DecodeCtx& c, size_t target) {
    const size_t full = c.full_steps;
    c.full_steps = target;
    kernel(c);
    c.full_steps = full;
  };
  const int width = group_width(path);
  // Escapes are patched in after a stream's last step, too late for the next job's ids.
  if (width < 2 || escapes || N == 0 || N % kLanes != 0 || block == 0 || block % kLanes != 0) {
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (Status st = prepare(j, 0, N); !st.ok()) return failed(j, st);
      if (Status st = finish_job(ctx[j], layout[j], n[j], kernel); !st.ok()) return failed(j, st);
      hook(j, 0, N, true);
    }
    return {};
  }
  // The wavefront: at round t job j decodes block t - j, so each job's block follows
  // the previous job's decode of it by one round.
  const size_t M = jobs.size(), steps_total = N / kLanes, block_steps = block / kLanes;
  const size_t blocks = (steps_total + block_steps - 1) / block_steps;
  for (size_t t = 0; t + 1 < blocks + M; ++t) {
    const size_t lo = t >= blocks ? t - blocks + 1 : 0, hi = std::min(M - 1, t);  // jobs with a block this round
    size_t want[kMaxChain];
    for (size_t j = lo; j <= hi; ++j) {
      const size_t b = t - j;
      want[j] = std::min(block_steps, steps_total - b * block_steps);
      if (Status st = prepare(j, b * block, b * block + want[j] * kLanes); !st.ok()) return failed(j, st);
    }
    // Interleaved, up to the kernel's width at a time; a round's blocks have one length
    // but for the last block, so streams group by length.
    size_t target[kMaxChain];
    for (size_t j = lo; j <= hi; ++j) target[j] = ctx[j].step + want[j];
    bool done[kMaxChain] = {};
    for (size_t j = lo; j <= hi; ++j) {
      if (done[j]) continue;
      DecodeCtx* group[4];
      int k = 0;
      for (size_t i = j; i <= hi && k < width; ++i)
        if (!done[i] && want[i] == want[j]) group[k++] = &ctx[i], done[i] = true;
      if (k >= 2)
        run_group(group, k, want[j], path, true);
      else
        run_until(ctx[j], target[j]);
    }
    for (size_t j = lo; j <= hi; ++j) {
      // A kernel stops early only when a corrupt stream overran its words; it stops the
      // streams of its group with it, and those finish their block alone.
      if (ctx[j].step != target[j] && ctx[j].wp <= ctx[j].wend) run_until(ctx[j], target[j]);
      if (ctx[j].step != target[j] || ctx[j].wp > ctx[j].wend)
        return failed(j, make_status(StatusCode::corrupt_data, "rans: word stream overrun"));
      const size_t b = t - j;
      hook(j, b * block, b * block + want[j] * kLanes, true);
    }
  }
  // Every step is decoded: what is left are the checks that each stream was whole.
  for (size_t j = 0; j < M; ++j)
    if (Status st = finish_job(ctx[j], layout[j], n[j], kernel); !st.ok()) return failed(j, st);
  return {};
}

Status rans_decode(const RansTables& tables, std::span<const uint8_t> table_of_col, std::span<const uint8_t> in,
                   int8_t* symbols_out, size_t rows, size_t cols, RansPath path) {
  const RansJob job{table_of_col, in, symbols_out, rows, cols};
  return rans_decode_group(tables, std::span(&job, 1), path);
}

}  // namespace kvstream::codec

// Static-table interleaved rANS: table building, encoder, and scalar / AVX2 /
// AVX-512 decoders. See rans.hpp for the format and docs/entropy-coding.md for the
// design and measurements.
#include "codec/entropy/rans.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvstream::codec {
namespace {

constexpr int kLanes = RANS_LANES;
constexpr uint32_t kProbMask = PROB_SCALE - 1;
constexpr uint32_t kStateLow = 1u << 16;  // states live in [kStateLow, 2^32)
constexpr uint8_t kEscapeByte = 0x80;     // decode-table symbol byte meaning "escape"
constexpr uint8_t kStreamVersion = 1;
constexpr uint8_t kTableVersion = 1;
constexpr size_t kHeaderBytes = 12;
constexpr size_t kStateBytes = 4 * kLanes;
constexpr size_t kStepWordBytes = 2 * kLanes;  // most word bytes one step can consume

static_assert(PROB_BITS >= 10 && PROB_BITS <= 12, "decode entry packs 8 + 2*PROB_BITS bits into 32");
static_assert(kLanes == 32, "SIMD kernels are written for 32 lanes");
// Lets SIMD loops read a full step's window whenever the word pointer has not
// passed the end of the word stream.
static_assert(kStateBytes >= kStepWordBytes);

// ---- little-endian helpers ----------------------------------------------------

inline uint32_t load_u16(const uint8_t* p) { return uint32_t(p[0]) | (uint32_t(p[1]) << 8); }
inline uint32_t load_u32(const uint8_t* p) { return load_u16(p) | (load_u16(p + 2) << 16); }
inline void put_u16(std::vector<uint8_t>& out, uint32_t v) {
  out.push_back(uint8_t(v));
  out.push_back(uint8_t(v >> 8));
}
inline void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  put_u16(out, v & 0xFFFF);
  put_u16(out, v >> 16);
}

// ---- normalization ------------------------------------------------------------

struct NormItem {
  uint64_t count;
  uint32_t freq;
};

// Greedy fix-up order: the cost of moving a frequency f by one step is about
// count / (f -/+ 1/2) bits, compared exactly by cross-multiplication (integers only,
// so every platform picks the same symbol; ties go to the lowest index).
void fix_sum(std::vector<NormItem>& items, uint32_t target) {
  uint64_t sum = 0;
  for (const auto& it : items) sum += it.freq;
  while (sum > target) {  // take from the symbol where a decrement costs least
    size_t best = items.size();
    for (size_t k = 0; k < items.size(); ++k) {
      if (items[k].freq <= 1) continue;
      if (best == items.size() ||
          items[k].count * (2ull * items[best].freq - 1) < items[best].count * (2ull * items[k].freq - 1))
        best = k;
    }
    --items[best].freq;  // exists: sum > target >= items.size() means some freq > 1
    --sum;
  }
  while (sum < target) {  // give to the symbol where an increment gains most
    size_t best = 0;
    for (size_t k = 1; k < items.size(); ++k)
      if (items[k].count * (2ull * items[best].freq + 1) > items[best].count * (2ull * items[k].freq + 1)) best = k;
    ++items[best].freq;
    ++sum;
  }
}

// Scales counts down (keeping nonzero ones nonzero) so that products of a count with
// a 13-bit number and sums of 256 counts cannot overflow 64 bits.
void prescale(std::vector<NormItem>& items) {
  uint64_t mx = 0;
  for (const auto& it : items) mx = std::max(mx, it.count);
  int shift = 0;
  while ((mx >> shift) > (1ull << 32)) ++shift;
  if (shift == 0) return;
  for (auto& it : items)
    if (it.count != 0) it.count = std::max<uint64_t>(1, it.count >> shift);
}

}  // namespace

// ---- FreqTable ----------------------------------------------------------------

Result<FreqTable> FreqTable::from_counts(std::span<const uint64_t> counts, int max_abs) {
  if (counts.size() != 256)
    return make_status(StatusCode::invalid_argument, "histogram has {} entries, expected 256", counts.size());
  if (max_abs < 0 || max_abs > 127)
    return make_status(StatusCode::invalid_argument, "max_abs {} outside [0, 127]", max_abs);

  // items[0 .. 2R] are values -R..R, the last one is the escape.
  std::vector<NormItem> items(2 * max_abs + 2, NormItem{0, 0});
  bool any_in_range = false;
  for (int v = -128; v <= 127; ++v) {
    const uint64_t c = counts[v + 128];
    if (v != -128 && std::abs(v) <= max_abs) {
      items[v + max_abs].count = c;
      any_in_range |= c != 0;
    } else {
      items.back().count = (items.back().count + c < c) ? ~0ull : items.back().count + c;  // saturate
    }
  }
  if (!any_in_range)
    return make_status(StatusCode::invalid_argument, "histogram has no count inside [-{}, {}]", max_abs, max_abs);

  prescale(items);
  uint64_t total = 0;
  for (const auto& it : items) total += it.count;
  for (auto& it : items)
    if (it.count != 0) it.freq = uint32_t(std::max<uint64_t>(1, (it.count * PROB_SCALE + total / 2) / total));
  items.back().freq = std::max<uint32_t>(items.back().freq, 1);  // escape always codable
  fix_sum(items, PROB_SCALE);

  FreqTable t;
  t.max_abs_ = max_abs;
  for (int v = -max_abs; v <= max_abs; ++v) t.freq_[v + 127] = uint16_t(items[v + max_abs].freq);
  t.escape_freq_ = uint16_t(items.back().freq);
  return t;
}

uint32_t FreqTable::freq(int v) const noexcept {
  if (v < -max_abs_ || v > max_abs_) return 0;
  return freq_[v + 127];
}

void FreqTable::serialize(std::vector<uint8_t>& out) const {
  out.push_back(kTableVersion);
  out.push_back(uint8_t(PROB_BITS));
  out.push_back(uint8_t(max_abs_));
  out.push_back(0);
  for (int v = -max_abs_; v <= max_abs_; ++v) put_u16(out, freq_[v + 127]);
  put_u16(out, escape_freq_);
}

Result<FreqTable> FreqTable::deserialize(std::span<const uint8_t> bytes, size_t* consumed) {
  if (bytes.size() < 4) return make_status(StatusCode::corrupt_data, "freq table: truncated header");
  if (bytes[0] != kTableVersion)
    return make_status(StatusCode::corrupt_data, "freq table: unknown version {}", bytes[0]);
  if (bytes[1] != PROB_BITS)
    return make_status(StatusCode::corrupt_data, "freq table: PROB_BITS {} != {}", bytes[1], PROB_BITS);
  const int r = bytes[2];
  if (r > 127 || bytes[3] != 0) return make_status(StatusCode::corrupt_data, "freq table: bad range byte {}", r);
  const size_t size = 4 + 2 * (2 * size_t(r) + 2);
  if (bytes.size() < size || (consumed == nullptr && bytes.size() != size))
    return make_status(StatusCode::corrupt_data, "freq table: {} bytes, expected {}", bytes.size(), size);

  FreqTable t;
  t.max_abs_ = r;
  uint32_t sum = 0;
  for (int v = -r; v <= r; ++v) {
    const uint32_t f = load_u16(&bytes[4 + 2 * size_t(v + r)]);
    t.freq_[v + 127] = uint16_t(f);
    sum += f;
  }
  t.escape_freq_ = uint16_t(load_u16(&bytes[size - 2]));
  sum += t.escape_freq_;
  if (t.escape_freq_ == 0) return make_status(StatusCode::corrupt_data, "freq table: zero escape frequency");
  if (sum != PROB_SCALE)
    return make_status(StatusCode::corrupt_data, "freq table: frequencies sum to {}, expected {}", sum, PROB_SCALE);
  if (consumed != nullptr) *consumed = size;
  return t;
}

double FreqTable::entropy_bits(std::span<const uint64_t> counts) {
  double total = 0;
  for (uint64_t c : counts) total += double(c);
  if (total == 0) return 0;
  double bits = 0;
  for (uint64_t c : counts)
    if (c != 0) bits -= double(c) * std::log2(double(c) / total);
  return bits / total;
}

double FreqTable::cost_bits(std::span<const uint64_t> counts) const {
  double total = 0, bits = 0;
  const double esc_bits = PROB_BITS - std::log2(double(escape_freq_)) + 8;
  for (size_t k = 0; k < counts.size(); ++k) {
    if (counts[k] == 0) continue;
    const uint32_t f = freq(int(k) - 128);
    total += double(counts[k]);
    bits += double(counts[k]) * (f != 0 ? PROB_BITS - std::log2(double(f)) : esc_bits);
  }
  return total == 0 ? 0 : bits / total;
}

// ---- RansTables ---------------------------------------------------------------

namespace {

uint32_t pack_dec(uint8_t sym, uint32_t bias, uint32_t freq) {
  return uint32_t(sym) | (bias << 8) | (freq << (8 + PROB_BITS));
}

// Lays out one table's cumulative frequencies (values -R..R ascending, then escape;
// this order is part of the format) into its decode and encode tables.
void fill_table(const FreqTable& t, uint32_t* dec, RansTables::EncEntry* enc) {
  auto entry = [](uint32_t freq, uint32_t start, bool escape) {
    const uint64_t rcp = freq <= 1 ? 0 : ~0ull / freq + 1;  // freq 0: overwritten by the escape below
    return RansTables::EncEntry{rcp, freq, uint16_t(start), uint16_t(escape)};
  };
  uint32_t start = 0;
  for (int v = -t.max_abs(); v <= t.max_abs(); ++v) {
    const uint32_t f = t.freq(v);
    for (uint32_t s = 0; s < f; ++s) dec[start + s] = pack_dec(uint8_t(int8_t(v)), s, f);
    enc[uint8_t(int8_t(v))] = entry(f, start, false);
    start += f;
  }
  const uint32_t fe = t.escape_freq();
  for (uint32_t s = 0; s < fe; ++s) dec[start + s] = pack_dec(kEscapeByte, s, fe);
  for (int b = 0; b < 256; ++b)
    if (enc[b].freq == 0) enc[b] = entry(fe, start, true);
}

}  // namespace

Result<RansTables> RansTables::build(std::span<const FreqTable> tables) {
  if (tables.empty() || tables.size() > RANS_MAX_TABLES)
    return make_status(StatusCode::invalid_argument, "{} tables, need 1..{}", tables.size(), RANS_MAX_TABLES);
  RansTables rt;
  rt.num_tables_ = tables.size();
  rt.dec_.assign(tables.size() * PROB_SCALE, 0);
  rt.enc_.assign(tables.size() * 256, EncEntry{0, 0, 0, 0});
  for (size_t t = 0; t < tables.size(); ++t) fill_table(tables[t], &rt.dec_[t * PROB_SCALE], &rt.enc_[t * 256]);
  return rt;
}

// ---- shared argument checks ---------------------------------------------------

namespace {

Status check_shape(const RansTables& tables, std::span<const uint8_t> table_of_col, size_t rows, size_t cols,
                   size_t& n) {
  if (table_of_col.size() != cols)
    return make_status(StatusCode::invalid_argument, "table_of_col has {} ids for {} columns", table_of_col.size(),
                       cols);
  for (size_t c = 0; c < cols; ++c)
    if (table_of_col[c] >= tables.size())
      return make_status(StatusCode::invalid_argument, "column {} uses table {} of {}", c, table_of_col[c],
                         tables.size());
  if (cols != 0 && rows > std::numeric_limits<uint32_t>::max() / cols)
    return make_status(StatusCode::out_of_range, "{} x {} symbols exceed 2^32 - 1", rows, cols);
  n = rows * cols;
  return {};
}

// ---- encoder ------------------------------------------------------------------

// x / freq for 32-bit x via a 64-bit reciprocal (Lemire et al., "Faster remainder by
// direct computation"); exact for every 32-bit x. freq 1 has rcp 0 and needs x itself.
#if defined(__SIZEOF_INT128__)
__extension__ using u128 = unsigned __int128;  // __extension__: no -Wpedantic noise
#endif

inline uint32_t div_freq(uint32_t x, const RansTables::EncEntry& e) {
#if defined(__SIZEOF_INT128__)
  const uint32_t q = uint32_t((static_cast<u128>(e.rcp) * x) >> 64);
  return e.freq == 1 ? x : q;
#else
  return x / e.freq;
#endif
}

}  // namespace

Status rans_encode(const RansTables& tables, std::span<const uint8_t> table_of_col, const int8_t* symbols,
                   size_t rows, size_t cols, std::vector<uint8_t>& out) {
  size_t n = 0;
  KVS_RETURN_IF_ERROR(check_shape(tables, table_of_col, rows, cols, n));
  if (n != 0 && symbols == nullptr) return make_status(StatusCode::invalid_argument, "null symbols");

  // rANS codes last-in-first-out: walk symbols backwards (lane = i mod 32 then runs
  // 31..0 within a step) and write words backwards, so the decoder reads forwards.
  // Each symbol emits at most one word.
  std::vector<uint8_t> words(2 * n + 2);
  uint8_t* wp = words.data() + words.size();
  std::vector<uint8_t> escapes;
  uint32_t state[kLanes];
  std::fill(std::begin(state), std::end(state), kStateLow);

  const RansTables::EncEntry* enc = tables.encode_table();
  size_t col = n == 0 ? 0 : (n - 1) % cols;
  for (size_t i = n; i-- > 0;) {
    const int8_t v = symbols[i];
    const auto& e = enc[size_t(table_of_col[col]) * 256 + uint8_t(v)];
    if (e.escape) [[unlikely]]
      escapes.push_back(uint8_t(v));
    uint32_t x = state[i % kLanes];
    // Renormalize so that the coded state stays below 2^32 (branch-free: the
    // emit decision is data-dependent and poorly predictable).
    const bool emit = x >= (e.freq << (32 - PROB_BITS));
    wp[-2] = uint8_t(x);
    wp[-1] = uint8_t(x >> 8);
    wp -= emit ? 2 : 0;
    x = emit ? x >> 16 : x;
    const uint32_t q = div_freq(x, e);
    state[i % kLanes] = (q << PROB_BITS) + (x - q * e.freq) + e.start;
    col = col == 0 ? cols - 1 : col - 1;
  }
  std::reverse(escapes.begin(), escapes.end());  // decoder consumes them in symbol order

  const size_t word_bytes = size_t(words.data() + words.size() - wp);
  const size_t old_size = out.size();
  out.reserve(old_size + kHeaderBytes + word_bytes + escapes.size() + kStateBytes);
  out.push_back(kStreamVersion);
  out.push_back(uint8_t(kLanes));
  out.push_back(uint8_t(PROB_BITS));
  out.push_back(0);
  put_u32(out, uint32_t(word_bytes / 2));
  put_u32(out, uint32_t(escapes.size()));
  out.insert(out.end(), wp, wp + word_bytes);
  out.insert(out.end(), escapes.begin(), escapes.end());
  for (uint32_t s : state) put_u32(out, s);
  return {};
}

// ---- decoder ------------------------------------------------------------------

namespace {

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

// Decodes 8 lanes of one step: gather the slot entries, update the states, write the
// 8 symbols, and refill the states that dropped below 2^16 from consecutive words.
__attribute__((target("avx2,popcnt"))) inline __m256i avx2_lanes8(__m256i x, const uint8_t* ids, const uint32_t* dec,
                                                                   int8_t* out, const uint8_t*& wp, __m128i& esc) {
  const __m256i pmask = _mm256_set1_epi32(int(kProbMask));
  const __m256i base = _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)ids)), PROB_BITS);
  const __m256i e = _mm256_i32gather_epi32((const int*)dec, _mm256_add_epi32(base, _mm256_and_si256(x, pmask)), 4);
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

// GCC 12 warns falsely inside its own AVX-512 headers (_mm512_undefined_epi32, GCC
// bug 105593); the warning says nothing about this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// AVX-512 version of avx2_lanes8 for 16 lanes; the refill uses vpexpandd.
__attribute__((target("avx512f,popcnt"))) inline __m512i avx512_lanes16(__m512i x, const uint8_t* ids,
                                                                         const uint32_t* dec, int8_t* out,
                                                                         const uint8_t*& wp, __m128i& esc) {
  const __m512i pmask = _mm512_set1_epi32(int(kProbMask));
  const __m512i base = _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)ids)), PROB_BITS);
  const __m512i e = _mm512_i32gather_epi32(_mm512_add_epi32(base, _mm512_and_si512(x, pmask)), dec, 4);
  const __m512i freq = _mm512_srli_epi32(e, 8 + PROB_BITS);
  const __m512i bias = _mm512_and_si512(_mm512_srli_epi32(e, 8), pmask);
  x = _mm512_add_epi32(_mm512_mullo_epi32(freq, _mm512_srli_epi32(x, PROB_BITS)), bias);

  const __m128i sym = _mm512_cvtepi32_epi8(e);  // truncation keeps the symbol byte
  _mm_storeu_si128((__m128i*)out, sym);
  esc = _mm_or_si128(esc, _mm_cmpeq_epi8(sym, _mm_set1_epi8(char(kEscapeByte))));

  const __mmask16 need = _mm512_cmplt_epu32_mask(x, _mm512_set1_epi32(int(kStateLow)));
  const __m512i w = _mm512_maskz_expand_epi32(need, _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)wp)));
  x = _mm512_mask_or_epi32(x, need, _mm512_slli_epi32(x, 16), w);
  wp += 2 * __builtin_popcount(unsigned(need));
  return x;
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

Status rans_decode(const RansTables& tables, std::span<const uint8_t> table_of_col, std::span<const uint8_t> in,
                   int8_t* symbols_out, size_t rows, size_t cols, RansPath path) {
  size_t n = 0;
  KVS_RETURN_IF_ERROR(check_shape(tables, table_of_col, rows, cols, n));
  if (n != 0 && symbols_out == nullptr) return make_status(StatusCode::invalid_argument, "null output");
  if (path == RansPath::automatic) path = rans_best_path();
  if (!rans_path_available(path))
    return make_status(StatusCode::unsupported, "rans: {} decoder not available on this CPU", rans_path_name(path));

  KVS_ASSIGN_OR_RETURN(const StreamLayout s, parse_header(in));
  if (s.total != in.size())
    return make_status(StatusCode::corrupt_data, "rans: {} bytes, header says {}", in.size(), s.total);
  if (s.n_words > n || s.n_escapes > n)
    return make_status(StatusCode::corrupt_data, "rans: {} words / {} escapes for {} symbols", s.n_words,
                       s.n_escapes, n);

  DecodeCtx c;
  c.dec = tables.decode_table();
  c.tid = table_of_col.data();
  c.cols = cols;
  c.n_mod = cols == 0 ? 0 : kLanes % cols;
  c.out = symbols_out;
  c.full_steps = n / kLanes;
  c.wp = in.data() + kHeaderBytes;
  c.wend = c.wp + 2 * s.n_words;
  const uint8_t* raw = c.wend;
  const uint8_t* states = raw + s.n_escapes;
  for (int l = 0; l < kLanes; ++l) {
    c.state[l] = load_u32(states + 4 * l);
    if (c.state[l] < kStateLow) return make_status(StatusCode::corrupt_data, "rans: lane {} start state too low", l);
  }

  if (n != 0) {
    kernel_for(path)(c);
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
  if (c.escape_seen || s.n_escapes != 0) KVS_RETURN_IF_ERROR(patch_escapes(symbols_out, n, raw, s.n_escapes));
  return {};
}

}  // namespace kvstream::codec

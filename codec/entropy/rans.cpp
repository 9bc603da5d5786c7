// Static-table interleaved rANS: frequency tables, their coding tables and the
// encoder (the decoders are in rans_decode.cpp). See rans.hpp for the format and
// docs/entropy-coding.md for the design and measurements.
#include "codec/entropy/rans.hpp"
#include "codec/entropy/rans_format.hpp"

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
using namespace rans_format;

namespace {

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

Status rans_check_ids(const RansTables& tables, std::span<const uint8_t> ids, size_t first_col) {
  // A max first (it vectorises; per-symbol ids make this as long as the matrix), the
  // offending column only on error.
  uint8_t top = 0;
  for (uint8_t id : ids) top = std::max(top, id);
  if (!ids.empty() && top >= tables.size())
    for (size_t c = 0; c < ids.size(); ++c)
      if (ids[c] >= tables.size())
        return make_status(StatusCode::invalid_argument, "column {} uses table {} of {}", first_col + c, ids[c],
                           tables.size());
  return {};
}

Status rans_check_shape(const RansTables& tables, std::span<const uint8_t> table_of_col, size_t rows, size_t cols,
                        size_t& n, bool check_ids) {
  if (table_of_col.size() != cols)
    return make_status(StatusCode::invalid_argument, "table_of_col has {} ids for {} columns", table_of_col.size(),
                       cols);
  if (check_ids) KVS_RETURN_IF_ERROR(rans_check_ids(tables, table_of_col));
  if (cols != 0 && rows > std::numeric_limits<uint32_t>::max() / cols)
    return make_status(StatusCode::out_of_range, "{} x {} symbols exceed 2^32 - 1", rows, cols);
  n = rows * cols;
  return {};
}

// ---- encoder ------------------------------------------------------------------

namespace {

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
  KVS_RETURN_IF_ERROR(rans_check_shape(tables, table_of_col, rows, cols, n));
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

}  // namespace kvstream::codec

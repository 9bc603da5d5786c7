// libFuzzer target: the rANS decoders (codec/entropy/rans_decode.cpp) on corrupt coded
// matrices, including the shapes the chunk fuzzer's small profiles never reach: the
// interleaved AVX-512 kernel's wide mode (more than 1024 columns, as a 7B MHA plane
// has 4096) and one-row refinement streams, in groups of matrices with different
// column counts and lengths.
//
// The input describes up to six matrices (shape, table ids, symbols, all derived from
// seeds in the input) that are encoded with rans_encode, then corrupted by the
// input's edits (a byte flipped, the stream cut short or grown). Invariants, beside
// memory safety (ASan, UBSan; every stream lives in its own exact-size allocation):
//   * rans_decode_group on every path this CPU has (scalar, AVX2, AVX-512) succeeds
//     exactly when every matrix decodes alone on the scalar path, and then gives the
//     scalar output bit for bit;
//   * a matrix no edit touched decodes alone to the symbols that were encoded;
//   * in chain mode (one-row matrices of one width, each one's table ids a function
//     of the symbols of the one before), rans_decode_chain on every path succeeds
//     exactly when the matrices decode one by one on the scalar path, each with ids
//     from the symbols the one before decoded, and then gives their output.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "codec/entropy/rans.hpp"
#include "kvstream/log.hpp"

using namespace kvstream;
using namespace kvstream::codec;

namespace {

[[noreturn]] void fail(const char* what, const Status& st = {}) {
  std::fprintf(stderr, "fuzz_rans_decoder: invariant broken: %s %s\n", what, st.to_string().c_str());
  std::abort();
}

// Four tables unlike each other: peaked and narrow, wide, flat, and one that leaves
// most values to the escape (so escapes are frequent).
const RansTables& tables() {
  static const RansTables t = [] {
    set_log_level(LogLevel::off);  // every corrupt stream would log a warning
    std::vector<FreqTable> fts;
    auto add = [&](int max_abs, auto count_of) {
      std::vector<uint64_t> counts(256, 0);
      for (int v = -max_abs; v <= max_abs; ++v) counts[size_t(v + 128)] = count_of(v);
      fts.push_back(FreqTable::from_counts(counts, max_abs).value());
    };
    add(3, [](int v) { return uint64_t(1) << (12 - 3 * std::abs(v)); });
    add(40, [](int v) { return uint64_t(4096 / (1 + std::abs(v))); });
    add(15, [](int) { return uint64_t(7); });
    add(1, [](int v) { return uint64_t(v == 0 ? 50 : 1); });
    return RansTables::build(fts).value();
  }();
  return t;
}

// Shapes (rows, cols): narrow and wide column counts, multiples of 32 (the
// interleaved kernels) and not (the wrapping path), one-row refinement streams.
constexpr size_t kShapes[][2] = {{1, 32}, {3, 33}, {2, 64}, {5, 96}, {4, 7},     {1, 2048}, {2, 1056},
                                 {1, 4096}, {3, 1024}, {1, 20480}, {6, 4096}, {9, 64}, {1, 1}, {0, 32}};
constexpr size_t kNumShapes = sizeof(kShapes) / sizeof(kShapes[0]);

struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t u8() { return n ? (--n, *p++) : 0; }
  uint32_t u32() { return uint32_t(u8()) | uint32_t(u8()) << 8 | uint32_t(u8()) << 16 | uint32_t(u8()) << 24; }
};

uint64_t next(uint64_t& s) {
  s += 0x9e3779b97f4a7c15ull;
  uint64_t x = s;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A chained matrix's table id for column c, from the symbol above it.
uint8_t chain_id(int8_t above, size_t c) { return uint8_t(above == 0 ? 0 : 1 + (c + size_t(above & 3)) % 3); }

struct Matrix {
  size_t rows = 0, cols = 0;
  std::vector<uint8_t> ids;
  std::vector<int8_t> symbols;
  std::unique_ptr<uint8_t[]> bytes;  // the encoded stream and room to grow it
  size_t size = 0, capacity = 0;
  bool edited = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in{data, size};
  const uint8_t head = in.u8();
  const size_t count = 1 + head % 6;
  // Chain mode: every matrix is one row of the first one's width, and matrix j's ids
  // are a function of matrix j - 1's symbols (rans_decode_chain).
  const bool chain = (head & 0x80) != 0;
  std::vector<Matrix> ms(count);
  for (size_t j = 0; j < count; ++j) {
    Matrix& m = ms[j];
    const uint8_t shape = in.u8(), table_mode = in.u8(), spread = in.u8();
    uint64_t seed = in.u32();
    m.rows = kShapes[shape % kNumShapes][0], m.cols = kShapes[shape % kNumShapes][1];
    if (chain) m.rows = 1, m.cols = j == 0 ? m.cols : ms[0].cols;
    // Symbols mostly small, a few anywhere in int8 (escapes where a table lacks them).
    m.symbols.resize(m.rows * m.cols);
    const int width = 1 + spread % 16;
    for (int8_t& s : m.symbols) {
      const uint64_t r = next(seed);
      s = (r & 0xff) < (spread >> 4) ? int8_t(uint8_t(r >> 8)) : int8_t(int(r >> 16) % (2 * width + 1) - width);
    }
    // Table ids: all one table, or per column from the seed; in a chain, from the
    // symbols of the matrix before.
    m.ids.resize(m.cols);
    for (size_t c = 0; c < m.cols; ++c)
      m.ids[c] = chain && j > 0 ? chain_id(ms[j - 1].symbols[c], c)
                                : uint8_t(table_mode < 128 ? table_mode % 4 : next(seed) % 4);
    std::vector<uint8_t> coded;
    if (Status st = rans_encode(tables(), m.ids, m.symbols.data(), m.rows, m.cols, coded); !st.ok())
      fail("rans_encode of a valid matrix", st);
    m.size = coded.size(), m.capacity = m.size + 64;
    m.bytes = std::make_unique<uint8_t[]>(m.capacity);
    std::memcpy(m.bytes.get(), coded.data(), m.size);
  }
  // Edits until the input runs out: 0-5 flip a byte, 6 cuts the stream short,
  // 7 grows it (the added bytes are the edit's own).
  while (in.n >= 6) {
    const uint8_t op = in.u8();
    Matrix& m = ms[(op >> 3) % count];
    const uint32_t at = in.u32();
    const uint8_t value = in.u8();
    if ((op & 7) <= 5) {
      if (m.size == 0 || value == 0) continue;
      m.bytes[at % m.size] ^= value;
    } else if ((op & 7) == 6) {
      m.size -= std::min<size_t>(m.size, 1 + at % 64);
    } else {
      const size_t grow = std::min<size_t>(1 + at % 32, m.capacity - m.size);
      std::memset(m.bytes.get() + m.size, value, grow);
      m.size += grow;
    }
    m.edited = true;
  }
  // Every stream in an allocation of exactly its (edited) size.
  std::vector<std::unique_ptr<uint8_t[]>> exact(count);
  for (size_t i = 0; i < count; ++i) {
    exact[i] = std::make_unique<uint8_t[]>(ms[i].size ? ms[i].size : 1);
    std::memcpy(exact[i].get(), ms[i].bytes.get(), ms[i].size);
  }
  auto job_of = [&](size_t i, int8_t* out) {
    return RansJob{ms[i].ids, std::span<const uint8_t>(exact[i].get(), ms[i].size), out, ms[i].rows, ms[i].cols};
  };

  // Each matrix alone, scalar: the reference.
  std::vector<std::vector<int8_t>> ref(count);
  bool all_ok = true;
  for (size_t i = 0; i < count; ++i) {
    ref[i].assign(ms[i].symbols.size(), 0);
    const Status st = rans_decode(tables(), ms[i].ids, {exact[i].get(), ms[i].size}, ref[i].data(), ms[i].rows,
                                  ms[i].cols, RansPath::scalar);
    if (!ms[i].edited && !st.ok()) fail("an untouched matrix failed to decode", st);
    if (!ms[i].edited && ref[i] != ms[i].symbols) fail("an untouched matrix decoded to other symbols");
    all_ok &= st.ok();
  }
  // The whole group on every path.
  for (RansPath path : {RansPath::scalar, RansPath::avx2, RansPath::avx512}) {
    if (!rans_path_available(path)) continue;
    std::vector<std::vector<int8_t>> out(count);
    std::vector<RansJob> jobs;
    for (size_t i = 0; i < count; ++i) {
      out[i].assign(ms[i].symbols.size(), 0);
      jobs.push_back(job_of(i, out[i].data()));
    }
    const Status st = rans_decode_group(tables(), jobs, path);
    if (st.ok() != all_ok) {
      std::fprintf(stderr, "path %s: group %s, alone %s\n", rans_path_name(path), st.ok() ? "ok" : "failed",
                   all_ok ? "all ok" : "some failed");
      fail("group and single decodes disagree on success", st);
    }
    if (st.ok() && out != ref) fail("group output differs from the scalar decode", st);
  }
  if (!chain) return 0;
  // The chain against the same jobs decoded one by one, each with ids from the symbols
  // the one before decoded (as far as they all decode).
  std::vector<std::vector<int8_t>> seq(count);
  bool seq_ok = true;
  for (size_t j = 0; j < count && seq_ok; ++j) {
    std::vector<uint8_t> ids = ms[j].ids;
    if (j > 0)
      for (size_t c = 0; c < ids.size(); ++c) ids[c] = chain_id(seq[j - 1][c], c);
    seq[j].assign(ms[j].cols, 0);
    seq_ok = rans_decode(tables(), ids, {exact[j].get(), ms[j].size}, seq[j].data(), 1, ms[j].cols, RansPath::scalar).ok();
  }
  for (RansPath path : {RansPath::scalar, RansPath::avx2, RansPath::avx512}) {
    if (!rans_path_available(path)) continue;
    std::vector<std::vector<int8_t>> out(count, std::vector<int8_t>(ms[0].cols, 0));
    std::vector<std::vector<uint8_t>> ids(count, std::vector<uint8_t>(ms[0].cols, 0));
    std::vector<RansJob> jobs;
    for (size_t j = 0; j < count; ++j)
      jobs.push_back({ids[j], std::span<const uint8_t>(exact[j].get(), ms[j].size), out[j].data(), 1, ms[j].cols});
    auto hook = [&](size_t j, size_t b, size_t e, bool decoded) {
      if (decoded) return;
      for (size_t c = b; c < e; ++c) ids[j][c] = j == 0 ? ms[0].ids[c] : chain_id(out[j - 1][c], c);
    };
    const size_t block = (head & 0x40) ? 33 : 32 * (1 + (head >> 3) % 8);  // 33: not a whole step
    const Status st = rans_decode_chain(tables(), jobs, block, hook, path);
    if (st.ok() != seq_ok) {
      std::fprintf(stderr, "path %s: chain %s, one by one %s\n", rans_path_name(path), st.ok() ? "ok" : "failed",
                   seq_ok ? "ok" : "failed");
      fail("chain and one-by-one decodes disagree on success", st);
    }
    if (st.ok() && out != seq) fail("chain output differs from the one-by-one decode", st);
  }
  return 0;
}

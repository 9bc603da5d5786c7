// Tests for the static-table interleaved rANS coder (codec/entropy/rans.hpp).
#include "codec/entropy/rans.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace kvstream::codec::test_rans {
namespace {

using Counts = std::vector<uint64_t>;

// Discretized Laplace histogram over [-127, 127] with scale b (in quantization steps).
Counts laplace_counts(double b, uint64_t total = 1000000) {
  Counts c(256, 0);
  for (int v = -127; v <= 127; ++v) c[v + 128] = uint64_t(double(total) * std::exp(-std::abs(v) / b));
  return c;
}

// Draws symbols whose distribution follows `counts`.
std::vector<int8_t> draw(const Counts& counts, size_t n, std::mt19937_64& rng) {
  std::discrete_distribution<int> dist(counts.begin(), counts.end());
  std::vector<int8_t> s(n);
  for (auto& v : s) v = int8_t(dist(rng) - 128);
  return s;
}

Counts histogram(const std::vector<int8_t>& s) {
  Counts c(256, 0);
  for (int8_t v : s) ++c[v + 128];
  return c;
}

std::vector<RansPath> available_paths() {
  std::vector<RansPath> p{RansPath::scalar};
  if (rans_path_available(RansPath::avx2)) p.push_back(RansPath::avx2);
  if (rans_path_available(RansPath::avx512)) p.push_back(RansPath::avx512);
  return p;
}

// Tables: Laplace of increasing width, one narrow table (R = 4) so escapes occur.
RansTables make_tables() {
  std::vector<FreqTable> t;
  for (double b : {0.3, 1.0, 2.5, 6.0}) t.push_back(FreqTable::from_counts(laplace_counts(b)).value());
  t.push_back(FreqTable::from_counts(laplace_counts(1.0), 4).value());
  return RansTables::build(t).value();
}

std::vector<uint8_t> col_ids(size_t cols, size_t num_tables) {
  std::vector<uint8_t> ids(cols);
  for (size_t c = 0; c < cols; ++c) ids[c] = uint8_t((c * 7 + c / 3) % num_tables);
  return ids;
}

// Encodes, then decodes on every path, expecting the original symbols.
void expect_round_trip(const RansTables& tables, const std::vector<int8_t>& sym, size_t rows, size_t cols) {
  const auto ids = col_ids(cols, tables.size());
  std::vector<uint8_t> coded;
  ASSERT_TRUE(rans_encode(tables, ids, sym.data(), rows, cols, coded).ok());
  ASSERT_EQ(rans_coded_size(coded).value(), coded.size());
  for (RansPath path : available_paths()) {
    std::vector<int8_t> out(rows * cols + 1, 42);  // +1: a sentinel that must survive
    const Status st = rans_decode(tables, ids, coded, out.data(), rows, cols, path);
    ASSERT_TRUE(st.ok()) << rans_path_name(path) << " " << rows << "x" << cols << ": " << st.message();
    ASSERT_EQ(out.back(), 42) << rans_path_name(path);
    out.pop_back();
    ASSERT_EQ(out, sym) << rans_path_name(path) << " " << rows << "x" << cols;
  }
}

TEST(FreqTable, NormalizesExactlyAndKeepsEverySeenValue) {
  Counts c(256, 0);
  c[128] = 1000000000000ull;  // value 0 dominates
  c[128 + 5] = 1;             // rare values still get a nonzero frequency
  c[128 - 100] = 3;
  c[0] = 7;  // -128: always an escape
  const auto t = FreqTable::from_counts(c).value();
  uint32_t sum = t.escape_freq();
  for (int v = -127; v <= 127; ++v) sum += t.freq(v);
  EXPECT_EQ(sum, PROB_SCALE);
  EXPECT_GE(t.freq(5), 1u);
  EXPECT_GE(t.freq(-100), 1u);
  EXPECT_EQ(t.freq(1), 0u);
  EXPECT_EQ(t.freq(-128), 0u);
  EXPECT_GE(t.escape_freq(), 1u);
  EXPECT_EQ(FreqTable::from_counts(c).value(), t);  // deterministic
}

TEST(FreqTable, HugeCountsDoNotOverflow) {
  Counts c(256, ~0ull / 300);
  const auto t = FreqTable::from_counts(c).value();
  uint32_t sum = t.escape_freq();
  for (int v = -127; v <= 127; ++v) sum += t.freq(v);
  EXPECT_EQ(sum, PROB_SCALE);
}

TEST(FreqTable, RejectsBadArguments) {
  EXPECT_EQ(FreqTable::from_counts(Counts(255, 1)).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(FreqTable::from_counts(Counts(256, 1), 128).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(FreqTable::from_counts(Counts(256, 0)).status().code(), StatusCode::invalid_argument);
  Counts only_far(256, 0);
  only_far[128 + 50] = 10;
  EXPECT_EQ(FreqTable::from_counts(only_far, 10).status().code(), StatusCode::invalid_argument);
}

TEST(FreqTable, SerializationRoundTrip) {
  for (int r : {0, 4, 16, 127}) {
    const auto t = FreqTable::from_counts(laplace_counts(2.0), r).value();
    std::vector<uint8_t> bytes;
    t.serialize(bytes);
    EXPECT_EQ(FreqTable::deserialize(bytes).value(), t);
    bytes.push_back(0xEE);  // trailing bytes: only allowed when the caller asks for `consumed`
    EXPECT_FALSE(FreqTable::deserialize(bytes).ok());
    size_t used = 0;
    EXPECT_EQ(FreqTable::deserialize(bytes, &used).value(), t);
    EXPECT_EQ(used, bytes.size() - 1);
  }
}

TEST(FreqTable, CorruptSerializationRejected) {
  const auto t = FreqTable::from_counts(laplace_counts(2.0), 16).value();
  std::vector<uint8_t> good;
  t.serialize(good);
  auto expect_corrupt = [](const std::vector<uint8_t>& b) {
    EXPECT_EQ(FreqTable::deserialize(b).status().code(), StatusCode::corrupt_data);
  };
  for (size_t len = 0; len < good.size(); ++len) expect_corrupt({good.begin(), good.begin() + long(len)});
  auto b = good;
  b[0] = 9;  // version
  expect_corrupt(b);
  b = good;
  b[1] = PROB_BITS + 1;
  expect_corrupt(b);
  b = good;
  b[2] = 200;  // R > 127
  expect_corrupt(b);
  b = good;
  b[4] ^= 1;  // sum != PROB_SCALE
  expect_corrupt(b);
  b = good;  // zero escape frequency, sum kept by moving it to value -R
  const uint32_t esc = b[b.size() - 2] | (b[b.size() - 1] << 8);
  const uint32_t f0 = (b[4] | (b[5] << 8)) + esc;
  b[4] = uint8_t(f0), b[5] = uint8_t(f0 >> 8), b[b.size() - 2] = 0, b[b.size() - 1] = 0;
  expect_corrupt(b);
  // Random garbage never crashes.
  std::mt19937_64 rng(5);
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> g(rng() % 600);
    for (auto& x : g) x = uint8_t(rng());
    if (!g.empty() && rng() % 2) g[0] = 1, g[1] = PROB_BITS;
    (void)FreqTable::deserialize(g);
  }
}

TEST(FreqTable, EntropyAndCost) {
  Counts c(256, 0);
  c[128] = 1, c[129] = 1;
  EXPECT_DOUBLE_EQ(FreqTable::entropy_bits(c), 1.0);
  const auto t = FreqTable::from_counts(c).value();
  EXPECT_NEAR(t.cost_bits(c), 1.0, 0.01);
}

TEST(RansTables, RejectsEmptyAndTooMany) {
  EXPECT_FALSE(RansTables::build({}).ok());
  std::vector<FreqTable> many(RANS_MAX_TABLES + 1, FreqTable::from_counts(laplace_counts(1)).value());
  EXPECT_FALSE(RansTables::build(many).ok());
}

TEST(Rans, RoundTripManyShapesAllPaths) {
  const RansTables tables = make_tables();
  std::mt19937_64 rng(1);
  const size_t col_set[] = {1, 2, 3, 7, 16, 31, 32, 33, 64, 100, 128, 257};
  const size_t row_set[] = {0, 1, 2, 3, 17, 100};
  for (size_t cols : col_set)
    for (size_t rows : row_set)
      for (double b : {0.5, 3.0}) {
        auto sym = draw(laplace_counts(b), rows * cols, rng);
        expect_round_trip(tables, sym, rows, cols);
      }
}

TEST(Rans, RoundTripAllByteValuesWithEscapes) {
  const RansTables tables = make_tables();
  std::mt19937_64 rng(2);
  for (size_t cols : {5, 32, 96}) {
    std::vector<int8_t> sym(40 * cols);
    for (auto& v : sym) v = int8_t(rng());  // uniform over all 256 values: many escapes
    expect_round_trip(tables, sym, 40, cols);
  }
}

TEST(Rans, RoundTripConstantMatrices) {
  const RansTables tables = make_tables();
  for (int8_t v : {int8_t(0), int8_t(1), int8_t(-128), int8_t(127), int8_t(-3)}) {
    std::vector<int8_t> sym(300 * 64, v);
    expect_round_trip(tables, sym, 300, 64);
    std::vector<int8_t> small(1 * 3, v);
    expect_round_trip(tables, small, 1, 3);
  }
}

TEST(Rans, EveryPathDecodesIdentically) {
  const RansTables tables = make_tables();
  std::mt19937_64 rng(3);
  const size_t rows = 333, cols = 128;
  auto sym = draw(laplace_counts(2.0), rows * cols, rng);
  for (size_t i = 0; i < sym.size(); i += 97) sym[i] = int8_t(rng());  // some escapes
  const auto ids = col_ids(cols, tables.size());
  std::vector<uint8_t> coded;
  ASSERT_TRUE(rans_encode(tables, ids, sym.data(), rows, cols, coded).ok());
  std::vector<int8_t> ref(rows * cols);
  ASSERT_TRUE(rans_decode(tables, ids, coded, ref.data(), rows, cols, RansPath::scalar).ok());
  for (RansPath path : available_paths()) {
    std::vector<int8_t> out(rows * cols);
    ASSERT_TRUE(rans_decode(tables, ids, coded, out.data(), rows, cols, path).ok());
    EXPECT_EQ(out, ref) << rans_path_name(path);
  }
  std::printf("decoder paths tested: ");
  for (RansPath p : available_paths()) std::printf("%s ", rans_path_name(p));
  std::printf("(automatic = %s)\n", rans_path_name(rans_best_path()));
}

// A group mixes what the interleaved kernels take (32-multiple columns, equal or
// unequal step counts) with what they leave to one-stream decoding (odd columns,
// fewer symbols than a step); every matrix must come out as rans_decode gives it.
TEST(Rans, GroupDecodesEachMatrixAsAlone) {
  const RansTables tables = make_tables();
  std::mt19937_64 rng(5);
  struct Shape {
    size_t rows, cols;
  };
  // Wider than 1024 columns (a 7B MHA plane; a refinement layer's single row) the
  // AVX-512 kernel reads its table offsets per step: two groups of those too.
  const std::vector<Shape> shapes = {{128, 32}, {128, 32}, {115, 32}, {13, 32},  {128, 32},  {40, 1024}, {7, 33},
                                     {1, 5},    {128, 32}, {300, 64}, {9, 4096}, {6, 4096}, {1, 20480}, {1, 20480}};
  std::vector<std::vector<int8_t>> sym;
  std::vector<std::vector<uint8_t>> ids, coded;
  for (const Shape& sh : shapes) {
    sym.push_back(draw(laplace_counts(1.0 + double(sym.size() % 3)), sh.rows * sh.cols, rng));
    for (size_t i = sym.size(); i < sym.back().size(); i += 211) sym.back()[i] = int8_t(rng());  // escapes
    ids.push_back(col_ids(sh.cols, tables.size()));
    coded.emplace_back();
    ASSERT_TRUE(rans_encode(tables, ids.back(), sym.back().data(), sh.rows, sh.cols, coded.back()).ok());
  }
  for (RansPath path : available_paths()) {
    std::vector<std::vector<int8_t>> out;
    std::vector<RansJob> jobs;
    for (size_t j = 0; j < shapes.size(); ++j) out.emplace_back(shapes[j].rows * shapes[j].cols);
    for (size_t j = 0; j < shapes.size(); ++j)
      jobs.push_back({ids[j], coded[j], out[j].data(), shapes[j].rows, shapes[j].cols});
    ASSERT_TRUE(rans_decode_group(tables, jobs, path).ok()) << rans_path_name(path);
    for (size_t j = 0; j < shapes.size(); ++j) EXPECT_EQ(out[j], sym[j]) << rans_path_name(path) << " job " << j;

    // One corrupt stream (a narrow one, a wide one) fails the group, named by its
    // index; a wrong shape too.
    for (const size_t j : {size_t(4), size_t(11)}) {
      std::vector<uint8_t> bad = coded[j];
      bad[bad.size() / 2] ^= 0x5a;
      jobs[j].in = bad;
      const Status st = rans_decode_group(tables, jobs, path);
      EXPECT_EQ(st.code(), StatusCode::corrupt_data) << rans_path_name(path);
      EXPECT_NE(st.to_string().find(fmt::format("job {}", j)), std::string::npos) << st.to_string();
      jobs[j].in = coded[j];
    }
    jobs[2].rows = 114;  // fewer symbols than were coded: words left over
    EXPECT_FALSE(rans_decode_group(tables, jobs, path).ok());
  }
  std::vector<RansJob> too_many(17, RansJob{ids[0], coded[0], nullptr, shapes[0].rows, shapes[0].cols});
  EXPECT_EQ(rans_decode_group(tables, too_many).code(), StatusCode::invalid_argument);
}

// A chain of one-row jobs where job j's table ids are a function of job j - 1's
// symbols (as a refinement layer's contexts are of the indices before it): each job
// comes out as encoded, every hook sees its range after the previous job decoded it,
// and the jobs run as a wavefront of blocks where the CPU interleaves, as one pass
// each where it cannot (the scalar path, escapes, a length off a whole step).
TEST(Rans, ChainDecodesEachJobAfterTheOneBefore) {
  const RansTables tables = make_tables();
  // Tables 2 and 3 only (wide enough that these draws never escape); escapes where wanted.
  auto id_after = [](int8_t before, size_t i) { return uint8_t(before == 0 ? 2 : 3 - i % 2); };
  for (const size_t N : {size_t(40960), size_t(32000), size_t(4005)}) {
    for (const bool escapes : {false, true}) {
      std::mt19937_64 rng(N + escapes);
      const size_t M = 3, block = 2048;
      std::vector<std::vector<int8_t>> sym(M);
      std::vector<std::vector<uint8_t>> ids(M), coded(M);
      for (size_t j = 0; j < M; ++j) {
        sym[j] = draw(laplace_counts(0.5 + double(j)), N, rng);
        if (escapes && j == 1) sym[j][N / 2] = 100;  // outside the narrow table: an escape, wherever it lands
        ids[j].resize(N);
        for (size_t i = 0; i < N; ++i) ids[j][i] = j == 0 ? uint8_t(2 + i % 2) : id_after(sym[j - 1][i], i);
        if (escapes && j == 1) ids[j][N / 2] = 4;
        ASSERT_TRUE(rans_encode(tables, ids[j], sym[j].data(), 1, N, coded[j]).ok());
      }
      for (RansPath path : available_paths()) {
        std::vector<std::vector<int8_t>> out(M, std::vector<int8_t>(N, 42));
        std::vector<std::vector<uint8_t>> ids_out(M, std::vector<uint8_t>(N, 255));
        std::vector<std::vector<bool>> seen(M, std::vector<bool>(N, false));
        std::vector<size_t> prepares(M, 0);
        std::vector<RansJob> jobs;
        for (size_t j = 0; j < M; ++j) jobs.push_back({ids_out[j], coded[j], out[j].data(), 1, N});
        bool order_ok = true;
        auto hook = [&](size_t j, size_t b, size_t e, bool decoded) {
          for (size_t i = b; i < e; ++i) {
            if (!decoded) {
              order_ok &= j == 0 || seen[j - 1][i];
              ids_out[j][i] = j == 0 ? uint8_t(2 + i % 2) : id_after(out[j - 1][i], i);
              if (escapes && j == 1 && i == N / 2) ids_out[j][i] = 4;
            } else {
              order_ok &= !seen[j][i];
              seen[j][i] = true;
            }
          }
          prepares[j] += decoded ? 0 : 1;
        };
        const Status st = rans_decode_chain(tables, jobs, block, hook, path);
        ASSERT_TRUE(st.ok()) << rans_path_name(path) << " N " << N << ": " << st.to_string();
        EXPECT_TRUE(order_ok) << rans_path_name(path) << " N " << N;
        for (size_t j = 0; j < M; ++j) {
          EXPECT_EQ(out[j], sym[j]) << rans_path_name(path) << " N " << N << " job " << j;
          EXPECT_EQ(std::count(seen[j].begin(), seen[j].end(), true), ptrdiff_t(N)) << "job " << j;
          const bool wavefront = path != RansPath::scalar && !escapes && N % 32 == 0;
          EXPECT_EQ(prepares[j], wavefront ? (N + block - 1) / block : 1) << rans_path_name(path) << " N " << N;
        }
        if (escapes || N % 32 != 0) continue;
        // A corrupt job fails the chain, named by its index; so does an id the hook
        // writes out of range.
        std::vector<uint8_t> bad = coded[1];
        bad[bad.size() / 3] ^= 0x5a;
        jobs[1].in = bad;
        std::fill(seen.begin(), seen.end(), std::vector<bool>(N, false));
        Status corrupt = rans_decode_chain(tables, jobs, block, hook, path);
        EXPECT_EQ(corrupt.code(), StatusCode::corrupt_data) << rans_path_name(path);
        EXPECT_NE(corrupt.to_string().find("job 1"), std::string::npos) << corrupt.to_string();
        jobs[1].in = coded[1];
        auto bad_ids = [&](size_t j, size_t b, size_t e, bool decoded) {
          hook(j, b, e, decoded);
          if (!decoded && j == 2) ids_out[j][b] = uint8_t(tables.size());
        };
        std::fill(seen.begin(), seen.end(), std::vector<bool>(N, false));
        EXPECT_EQ(rans_decode_chain(tables, jobs, block, bad_ids, path).code(), StatusCode::invalid_argument);
      }
    }
  }
}

TEST(Rans, EncodingIsDeterministicAndAppends) {
  const RansTables tables = make_tables();
  std::mt19937_64 rng(4);
  auto sym = draw(laplace_counts(1.5), 50 * 40, rng);
  const auto ids = col_ids(40, tables.size());
  std::vector<uint8_t> a{1, 2, 3}, b;
  ASSERT_TRUE(rans_encode(tables, ids, sym.data(), 50, 40, a).ok());
  ASSERT_TRUE(rans_encode(tables, ids, sym.data(), 50, 40, b).ok());
  ASSERT_EQ(a.size(), b.size() + 3);
  EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin() + 3));
}

TEST(Rans, RejectsBadArguments) {
  const RansTables tables = make_tables();
  std::vector<int8_t> sym(64, 0), out(64);
  std::vector<uint8_t> ids(32, 0), coded;
  ASSERT_TRUE(rans_encode(tables, ids, sym.data(), 2, 32, coded).ok());
  std::vector<uint8_t> short_ids(31, 0), bad_ids(32, 0);
  bad_ids[7] = uint8_t(tables.size());
  EXPECT_EQ(rans_encode(tables, short_ids, sym.data(), 2, 32, coded).code(), StatusCode::invalid_argument);
  EXPECT_EQ(rans_encode(tables, bad_ids, sym.data(), 2, 32, coded).code(), StatusCode::invalid_argument);
  EXPECT_EQ(rans_decode(tables, bad_ids, coded, out.data(), 2, 32).code(), StatusCode::invalid_argument);
  // Shape mismatch with the coded stream is corruption (different symbol count).
  EXPECT_FALSE(rans_decode(tables, ids, coded, out.data(), 1, 32).ok());
  // Oversized input.
  auto big = coded;
  big.push_back(0);
  EXPECT_EQ(rans_decode(tables, ids, big, out.data(), 2, 32).code(), StatusCode::corrupt_data);
}

TEST(Rans, TruncationAtEveryOffsetFails) {
  const RansTables tables = make_tables();
  std::mt19937_64 rng(6);
  const size_t rows = 9, cols = 37;
  auto sym = draw(laplace_counts(3.0), rows * cols, rng);
  sym[5] = -128, sym[77] = 100;  // escapes present
  const auto ids = col_ids(cols, tables.size());
  std::vector<uint8_t> coded;
  ASSERT_TRUE(rans_encode(tables, ids, sym.data(), rows, cols, coded).ok());
  for (RansPath path : available_paths())
    for (size_t len = 0; len < coded.size(); ++len) {
      // Copy into an exact-size heap buffer so ASan sees any over-read.
      std::vector<uint8_t> cut(coded.begin(), coded.begin() + long(len));
      cut.shrink_to_fit();
      std::vector<int8_t> out(rows * cols);
      EXPECT_EQ(rans_decode(tables, ids, cut, out.data(), rows, cols, path).code(), StatusCode::corrupt_data)
          << "len " << len;
    }
}

TEST(Rans, RandomCorruptionNeverCrashes) {
  const RansTables tables = make_tables();
  std::mt19937_64 rng(7);
  const size_t rows = 64, cols = 96;
  auto sym = draw(laplace_counts(2.0), rows * cols, rng);
  for (size_t i = 0; i < sym.size(); i += 301) sym[i] = int8_t(rng());
  const auto ids = col_ids(cols, tables.size());
  std::vector<uint8_t> coded;
  ASSERT_TRUE(rans_encode(tables, ids, sym.data(), rows, cols, coded).ok());
  int detected = 0, trials = 0;
  for (RansPath path : available_paths())
    for (int t = 0; t < 3000; ++t) {
      auto bad = coded;
      const int flips = 1 + int(rng() % 4);
      for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] ^= uint8_t(1u << (rng() % 8));
      std::vector<int8_t> out(rows * cols);
      const Status st = rans_decode(tables, ids, bad, out.data(), rows, cols, path);
      ++trials;
      detected += !st.ok() || out != sym;  // either reported or (rarely) silently different
      if (st.ok()) continue;
      EXPECT_EQ(st.code(), StatusCode::corrupt_data);
    }
  EXPECT_EQ(detected, trials);  // a flip never yields the original symbols with ok
}

TEST(Rans, CompressedSizeNearEntropy) {
  std::mt19937_64 rng(8);
  for (double b : {0.7, 1.5, 3.0}) {
    const Counts model = laplace_counts(b);
    const auto sym = draw(model, 1 << 20, rng);
    const Counts hist = histogram(sym);
    const auto table = FreqTable::from_counts(hist).value();
    const auto tables = RansTables::build(std::span(&table, 1)).value();
    const std::vector<uint8_t> ids(128, 0);
    std::vector<uint8_t> coded;
    ASSERT_TRUE(rans_encode(tables, ids, sym.data(), sym.size() / 128, 128, coded).ok());
    const double h = FreqTable::entropy_bits(hist);
    const double bits = 8.0 * double(coded.size()) / double(sym.size());
    std::printf("laplace b=%.1f: entropy %.4f, table cost %.4f, coded %.4f bits/symbol (+%.2f%%)\n", b, h,
                table.cost_bits(hist), bits, 100.0 * (bits / h - 1));
    EXPECT_LT(bits, h * 1.02) << "b=" << b;
  }
}

}  // namespace
}  // namespace kvstream::codec::test_rans

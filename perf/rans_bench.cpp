// Micro-benchmark of the static rANS coder: one thread, discretized Laplace sources
// spread over 8 tables, cols = 32 and 128. Prints encode/decode symbols per second
// per decoder path, bits per symbol against the empirical entropy, and memcpy speed
// over the same byte count for reference; then the interleaved decode of several
// small matrices in one call, as a chunk's base is decoded.
//
//   rans_bench [symbols_per_matrix (default 1048576)] [repetitions (default 15)]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <CLI/CLI.hpp>

#include "codec/entropy/rans.hpp"

using namespace kvstream::codec;

namespace {


double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best-of-`reps` seconds for one call of f (shared machine: the minimum is the most
// stable statistic).
template <typename F>
double best_time(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    f();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

std::vector<double> laplace_pmf(double b) {
  std::vector<double> p(256, 0.0);
  double sum = 0;
  for (int v = -127; v <= 127; ++v) sum += p[v + 128] = std::exp(-std::abs(v) / b);
  for (double& x : p) x /= sum;
  return p;
}

double entropy(const std::vector<double>& p) {
  double h = 0;
  for (double x : p)
    if (x > 0) h -= x * std::log2(x);
  return h;
}

// Laplace scale whose discretized entropy is `bits` (bisection; entropy grows with b).
double scale_for_entropy(double bits) {
  double lo = 0.01, hi = 100;
  for (int i = 0; i < 60; ++i) {
    const double mid = std::sqrt(lo * hi);
    (entropy(laplace_pmf(mid)) < bits ? lo : hi) = mid;
  }
  return lo;
}

struct Source {
  std::vector<int8_t> symbols;
  std::vector<uint8_t> table_of_col;
  std::vector<std::vector<uint64_t>> hist;  // per table
};

// Column c uses table c % tables; table t has Laplace scale b * (0.65 + 0.8 t / tables),
// so the tables differ but the mean entropy stays near the target.
Source make_source(double b, int tables, size_t rows, size_t cols, std::mt19937_64& rng) {
  Source s;
  s.table_of_col.resize(cols);
  s.hist.assign(tables, std::vector<uint64_t>(256, 0));
  std::vector<std::discrete_distribution<int>> dist;
  for (int t = 0; t < tables; ++t) {
    const auto p = laplace_pmf(b * (0.65 + 0.8 * t / tables));
    dist.emplace_back(p.begin(), p.end());
  }
  for (size_t c = 0; c < cols; ++c) s.table_of_col[c] = uint8_t(c % tables);
  s.symbols.resize(rows * cols);
  for (size_t i = 0; i < s.symbols.size(); ++i) {
    const int t = s.table_of_col[i % cols];
    const int v = dist[t](rng) - 128;
    s.symbols[i] = int8_t(v);
    ++s.hist[t][v + 128];
  }
  return s;
}

double conditional_entropy(const Source& s) {
  double bits = 0, n = 0;
  for (const auto& h : s.hist) {
    double tot = 0;
    for (auto c : h) tot += double(c);
    bits += FreqTable::entropy_bits(h) * tot;
    n += tot;
  }
  return bits / n;
}

void run_case(double target_bits, int num_tables, size_t cols, size_t n, int reps, double memcpy_gbs) {
  std::mt19937_64 rng(uint64_t(target_bits * 1000) + cols);
  const size_t rows = n / cols;
  const Source src = make_source(scale_for_entropy(target_bits), num_tables, rows, cols, rng);
  std::vector<FreqTable> ft;
  for (const auto& h : src.hist) ft.push_back(FreqTable::from_counts(h).value());
  const RansTables tables = RansTables::build(ft).value();

  std::vector<uint8_t> coded;
  const double enc_s = best_time(std::max(3, reps / 3), [&] {
    coded.clear();
    if (!rans_encode(tables, src.table_of_col, src.symbols.data(), rows, cols, coded).ok()) std::abort();
  });
  const double syms = double(rows * cols);
  const double h = conditional_entropy(src);
  const double bits = 8.0 * double(coded.size()) / syms;
  std::printf("%5.2f %6d %5zu %8.4f %8.4f %+6.2f%% %9.0f", target_bits, num_tables, cols, h, bits,
              100 * (bits / h - 1), syms / enc_s / 1e6);

  std::vector<int8_t> out(rows * cols);
  for (RansPath path : {RansPath::scalar, RansPath::avx2, RansPath::avx512}) {
    if (!rans_path_available(path)) {
      std::printf(" %9s", "n/a");
      continue;
    }
    const double dec_s = best_time(reps, [&] {
      if (!rans_decode(tables, src.table_of_col, coded, out.data(), rows, cols, path).ok()) std::abort();
    });
    if (out != src.symbols) std::abort();
    std::printf(" %9.0f", syms / dec_s / 1e6);
  }
  std::printf("   (memcpy %.1f GB/s)\n", memcpy_gbs);
}

// A chunk's base as the layered decoder meets it: `matrices` matrices of 128 x 32
// (tinyllama's 5 layers x K/V) in one rans_decode_group call, so the interleaved
// kernels run; each matrix its own source.
void run_group_case(double target_bits, size_t matrices, int reps) {
  constexpr size_t rows = 128, cols = 32;
  std::mt19937_64 rng(uint64_t(target_bits * 1000) + matrices);
  std::vector<Source> src;
  std::vector<FreqTable> ft;
  for (size_t m = 0; m < matrices; ++m) src.push_back(make_source(scale_for_entropy(target_bits), 8, rows, cols, rng));
  for (const auto& h : src[0].hist) ft.push_back(FreqTable::from_counts(h).value());
  const RansTables tables = RansTables::build(ft).value();
  std::vector<std::vector<uint8_t>> coded(matrices);
  std::vector<std::vector<int8_t>> out(matrices, std::vector<int8_t>(rows * cols));
  std::vector<RansJob> jobs(matrices);
  for (size_t m = 0; m < matrices; ++m) {
    if (!rans_encode(tables, src[m].table_of_col, src[m].symbols.data(), rows, cols, coded[m]).ok()) std::abort();
    jobs[m] = {src[m].table_of_col, coded[m], out[m].data(), rows, cols};
  }
  std::printf("%5.2f %8zu", target_bits, matrices);
  const double syms = double(matrices * rows * cols);
  for (RansPath path : {RansPath::scalar, RansPath::avx2, RansPath::avx512}) {
    if (!rans_path_available(path)) {
      std::printf(" %9s", "n/a");
      continue;
    }
    // Many calls per timing: one call is a few microseconds.
    constexpr int kCalls = 200;
    const double dec_s = best_time(reps, [&] {
      for (int i = 0; i < kCalls; ++i)
        if (!rans_decode_group(tables, jobs, path).ok()) std::abort();
    });
    for (size_t m = 0; m < matrices; ++m)
      if (out[m] != src[m].symbols) std::abort();
    std::printf(" %9.0f", kCalls * syms / dec_s / 1e6);
  }
  std::printf("\n");
}

double memcpy_gbs(size_t bytes, int reps) {
  std::vector<uint8_t> a(bytes, 1), b(bytes, 0);
  const double t = best_time(reps * 4, [&] {
    std::memcpy(b.data(), a.data(), bytes);
    asm volatile("" ::"r"(b.data()) : "memory");
  });
  return double(bytes) / t / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Micro-benchmark of the static rANS coder (one thread): encode/decode speed per decoder path, "
               "bits per symbol against the entropy, memcpy for reference"};
  size_t n = 1u << 20;
  int reps = 15;
  // Positional, as before. The last case has 1024 columns: fewer symbols than that leave
  // no row to code (and empty histograms, which no frequency table can be built from).
  app.add_option("symbols_per_matrix", n, "symbols per matrix (at least 1024)")
      ->check(CLI::Range(size_t(1024), size_t(1) << 34))
      ->capture_default_str();
  app.add_option("repetitions", reps, "timed repetitions; the best is reported")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::printf("rANS bench: PROB_BITS=%d lanes=%d, %zu symbols/matrix, best of %d, one thread\n", PROB_BITS,
              RANS_LANES, n, reps);
  std::printf("automatic decoder path: %s\n", rans_path_name(rans_best_path()));
  std::printf("%5s %6s %5s %8s %8s %7s %9s %9s %9s %9s\n", "H~", "tables", "cols", "entropy", "bits/sym", "over",
              "enc M/s", "scalar", "avx2", "avx512");
  for (double target : {1.5, 2.5, 3.5})
    for (size_t cols : {32, 128}) run_case(target, 8, cols, n, reps, memcpy_gbs(n, reps));
  // Worst case for cache residency: a profile with 64 tables all used by one matrix.
  run_case(2.5, 64, 1024, n, reps, memcpy_gbs(n, reps));
  std::printf("\ninterleaved: 128 x 32 matrices in one rans_decode_group call, decode M symbols/s\n");
  std::printf("%5s %8s %9s %9s %9s\n", "H~", "matrices", "scalar", "avx2", "avx512");
  for (double target : {1.5, 2.5})
    for (size_t matrices : {4, 10}) run_group_case(target, matrices, reps);
  return 0;
}

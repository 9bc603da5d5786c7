// Inputs shared by the policy tests (test_policy.cpp, test_chooser.cpp,
// test_study.cpp): units, a random generator that gives the same numbers on every
// platform, link traces, the cost tables of two contexts, and an estimator factory
// whose failure is a test failure. They live in one place so the estimator, chooser
// and study tests run on the same contexts and links.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "kvstream/policy.hpp"
#include "tests/policy/fixed_estimator.hpp"

namespace kvstream::policy::test {

inline constexpr double kGbit = 1e9;
inline constexpr uint64_t kMB = 1000 * 1000;

// Deterministic on every platform (std distributions are not).
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * double(next() >> 11) * 0x1.0p-53; }
};

inline LinkTrace constant_link(double bps, double latency = 0) { return LinkTrace{{{0, bps}}, latency}; }

// 8 chunks x 4 levels (level 0 best, largest), from a fixed table.
inline ContextCosts study_costs(bool with_text = true) {
  const double scale[8] = {1.0, 0.9, 1.1, 1.05, 0.95, 1.2, 0.85, 1.0};
  const uint64_t base[4] = {24 * kMB, 12 * kMB, 6 * kMB, 3 * kMB};
  const double decode[4] = {0.012, 0.010, 0.008, 0.006};
  ContextCosts c;
  c.level_quality_loss = {0.5, 1.5, 4.0, 10.0};
  for (int i = 0; i < 8; ++i) {
    std::vector<uint64_t> b;
    std::vector<double> d;
    for (int l = 0; l < 4; ++l) {
      b.push_back(uint64_t(double(base[l]) * scale[i]));
      d.push_back(decode[l] * scale[i]);
    }
    c.level_bytes.push_back(b);
    c.decode_seconds.push_back(d);
    c.tokens.push_back(1024);
  }
  if (with_text) c.recompute_tokens_per_second = 3000;
  return c;
}

// Rates in [0.1, 8] Gbit/s, log-uniform (or uniform), each held for 0.5-2 s.
inline LinkTrace random_trace(SplitMix& rng, double horizon_s = 30, bool log_uniform = true, double latency_s = 0.002) {
  LinkTrace t;
  t.latency_s = latency_s;
  double at = 0;
  while (at < horizon_s) {
    t.segments.push_back({at, log_uniform ? kGbit * 0.1 * std::exp(rng.uniform(0, std::log(80.0)))
                                          : kGbit * rng.uniform(0.1, 8)});
    at += rng.uniform(0.5, 2.0);
  }
  return t;
}

inline std::unique_ptr<Estimator> est(std::string_view name, EstimatorOptions o = {}) {
  auto e = make_estimator(name, o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

// A context shaped like the adapt benchmark's: mistral-7b, 12 chunks of 512 tokens,
// 11 levels (3.5-23.4 MB per chunk), decode 2.5 ns per encoded byte, text at 5000 tok/s
// (0.1 s per chunk: all text takes 1.23 s, over a 1 s deadline).
inline ContextCosts mistral_costs() {
  const uint64_t bytes[11] = {23417057, 19579531, 16036380, 13013246, 10455066, 8493578,
                              7526604,  6801885,  5944498,  5265925,  3542785};
  const double loss[11] = {0.015, 0, 0, 0.072, 0.011, 0.232, 0.475, 0.445, 1.378, 2.125, 4.29};
  ContextCosts c;
  c.level_quality_loss.assign(loss, loss + 11);
  for (int i = 0; i < 12; ++i) {
    std::vector<uint64_t> b(bytes, bytes + 11);
    std::vector<double> d;
    for (uint64_t x : b) d.push_back(double(x) * 2.5e-9);
    c.level_bytes.push_back(b);
    c.decode_seconds.push_back(d);
    c.tokens.push_back(512);
  }
  c.recompute_tokens_per_second = 5000;
  return c;
}

}  // namespace kvstream::policy::test

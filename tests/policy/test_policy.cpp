// Link traces and bandwidth estimators: traces (transfer times across segments and
// outages, parsing, bad traces), the estimator registry and per-peer set, bad inputs,
// convergence on a constant link, the oracle against its trace, and how fast each
// estimator follows a sudden drop, alone and through a chooser on the simulator. The
// choosers decide from these predictions, so an estimator that lags or a trace that
// computes wrong transfer ends would make every choice wrong.
//
// The choosers are tested in test_chooser.cpp, the mini-study in test_study.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kvstream/policy.hpp"
#include "tests/policy/fixed_estimator.hpp"
#include "tests/policy/policy_inputs.hpp"

namespace kvstream::test_policy {

using namespace kvstream::policy;
using namespace kvstream::policy::test;  // policy_inputs.hpp, fixed_estimator.hpp

// ---- Traces -----------------------------------------------------------------------

TEST(Trace, TransferEndAcrossSegmentsWithLatency) {
  LinkTrace t{{{0, 8e6}, {1, 0}, {2, 16e6}}, 0.5};  // 1 MB/s, outage, 2 MB/s
  ASSERT_TRUE(t.validate().ok());
  // Starts at 0.5 after latency; 0.5 MB by t=1, outage to 2, then 0.5 MB at 2 MB/s.
  auto end = t.transfer_end(0, 1 * kMB);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_NEAR(*end, 2.25, 1e-12);
  EXPECT_NEAR(*t.transfer_end(3, 2 * kMB), 4.5, 1e-12);
  EXPECT_EQ(t.rate_at(1.5), 0);
  EXPECT_EQ(t.rate_at(7), 16e6);
}

TEST(Trace, BadTracesAreClearErrors) {
  EXPECT_EQ(LinkTrace{}.validate().code(), StatusCode::invalid_argument);
  EXPECT_NE(LinkTrace{}.validate().message().find("no segments"), std::string::npos);
  EXPECT_EQ((LinkTrace{{{0, 1e9}, {0, 1e9}}}).validate().code(), StatusCode::invalid_argument);
  EXPECT_EQ((LinkTrace{{{1, 1e9}}}).validate().code(), StatusCode::invalid_argument);
  EXPECT_EQ((LinkTrace{{{0, 1e9}, {1, 0}}}).validate().code(), StatusCode::invalid_argument);
  EXPECT_EQ((LinkTrace{{{0, -5}}}).validate().code(), StatusCode::invalid_argument);
  EXPECT_EQ((LinkTrace{{{0, 1e9}}, -1}).validate().code(), StatusCode::invalid_argument);
  auto t = constant_link(1e9);
  EXPECT_EQ(t.transfer_end(-1, 10).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(t.transfer_end(0, 0).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(LinkTrace{}.transfer_end(0, 10).status().code(), StatusCode::invalid_argument);
}

TEST(Trace, Parse) {
  auto t = parse_trace("# a link\nlatency 0.003\n0 8e9\n1.5   1e8 # drop\n\n3 2e9\n");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->segments.size(), 3u);
  EXPECT_EQ(t->latency_s, 0.003);
  EXPECT_EQ(t->segments[1].start_s, 1.5);
  EXPECT_EQ(t->segments[1].bits_per_second, 1e8);
  auto bad = parse_trace("0 1e9\nx y\n");
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status();
  EXPECT_EQ(parse_trace("").status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(parse_trace("0 1 2\n").status().code(), StatusCode::invalid_argument);
}

// ---- Estimators -----------------------------------------------------------------------

TEST(Estimator, BadInputsAreClearErrors) {
  for (const char* name : {"last", "ewma", "harmonic", "percentile"}) {
    auto e = est(name);
    EXPECT_EQ(e->observe(0, 0, 1).code(), StatusCode::invalid_argument) << name;
    EXPECT_EQ(e->observe(10, -1, 1).code(), StatusCode::invalid_argument) << name;
    EXPECT_EQ(e->observe(10, 0, -1).code(), StatusCode::invalid_argument) << name;
    EXPECT_EQ(e->observe(10, 2, 1).code(), StatusCode::invalid_argument) << name;
    EXPECT_EQ(e->observe(10, 1, 1).code(), StatusCode::invalid_argument) << name;
    EXPECT_EQ(e->observe(10, 0, NAN).code(), StatusCode::invalid_argument) << name;
    EXPECT_EQ(e->observations(), 0u) << "a rejected observation must not count";
    EXPECT_EQ(e->predict(100).status().code(), StatusCode::unavailable) << name;
    EXPECT_EQ(e->predict(0).status().code(), StatusCode::invalid_argument) << name;
    // With a prior: bytes * 8 / prior.
    auto p = est(name, {.prior_bits_per_second = 8e6})->predict(kMB);
    ASSERT_TRUE(p.ok());
    EXPECT_NEAR(p->seconds, 1.0, 1e-12);
  }
  EXPECT_EQ(make_estimator("ewma", {.alpha = 0}).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(make_estimator("ewma", {.window = 0}).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(make_estimator("percentile", {.percentile = 1.5}).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(make_estimator("last", {.prior_bits_per_second = -1}).status().code(), StatusCode::invalid_argument);
}

TEST(Registry, DuplicateAndUnknownNames) {
  EstimatorRegistry reg;
  EXPECT_EQ(reg.names(), (std::vector<std::string>{"ewma", "harmonic", "last", "oracle", "percentile"}));
  auto dup = reg.add("last", [](const EstimatorOptions& o) { return EstimatorRegistry::global().make("ewma", o); });
  EXPECT_EQ(dup.code(), StatusCode::already_exists);
  EXPECT_NE(dup.message().find("'last'"), std::string::npos) << dup;
  EXPECT_EQ(reg.add("", [](const EstimatorOptions& o) { return make_estimator("last", o); }).code(),
            StatusCode::invalid_argument);
  EXPECT_EQ(reg.add("empty", nullptr).code(), StatusCode::invalid_argument);
  auto unknown = reg.make("lastt");
  EXPECT_EQ(unknown.status().code(), StatusCode::not_found);
  EXPECT_NE(unknown.status().message().find("known: ewma, harmonic, last"), std::string::npos) << unknown.status();

  // A runtime's own estimator.
  ASSERT_TRUE(reg.add("fixed1g", [](const EstimatorOptions&) -> Result<std::unique_ptr<Estimator>> {
                   return std::unique_ptr<Estimator>(std::make_unique<FixedEstimator>(1e9));
                 }).ok());
  EXPECT_EQ(reg.add("fixed1g", [](const EstimatorOptions& o) { return make_estimator("last", o); }).code(),
            StatusCode::already_exists);
  auto mine = reg.make("fixed1g");
  ASSERT_TRUE(mine.ok());
  EXPECT_NEAR((*mine)->predict(125 * kMB)->seconds, 1.0, 1e-12);
  EXPECT_FALSE(EstimatorRegistry::global().contains("fixed1g")) << "registries are independent";

  // The global registry through the free functions.
  ASSERT_TRUE(register_estimator("test_policy_global", [](const EstimatorOptions& o) {
                return make_estimator("harmonic", o);
              }).ok());
  EXPECT_EQ(register_estimator("test_policy_global", [](const EstimatorOptions& o) {
              return make_estimator("harmonic", o);
            }).code(),
            StatusCode::already_exists);
  EXPECT_TRUE(make_estimator("test_policy_global").ok());
  EXPECT_EQ(make_estimator("nope").status().code(), StatusCode::not_found);
  EXPECT_EQ(make_estimator("oracle").status().code(), StatusCode::invalid_argument) << "oracle needs a trace";
}

TEST(Estimator, ConvergesOnConstantLink) {
  const double bps = 2 * kGbit;
  auto trace = std::make_shared<const LinkTrace>(constant_link(bps));
  SimConfig cfg{*trace, study_costs(false), 0, 10};
  for (const char* name : {"last", "ewma", "harmonic", "percentile", "oracle"}) {
    auto e = est(name, {.prior_bits_per_second = 0.3 * kGbit, .trace = trace});
    auto r = simulate(cfg, *e, DeadlineChooser{});
    ASSERT_TRUE(r.ok()) << r.status();
    auto p = e->predict(10 * kMB);
    ASSERT_TRUE(p.ok());
    EXPECT_NEAR(p->seconds, 10.0 * 8e6 / bps, 1e-9) << name;
    EXPECT_NEAR(p->uncertainty_seconds, 0, 1e-9) << name;
    EXPECT_FALSE(r->violated) << name;
    EXPECT_EQ(r->chunks.back().choice.level, 0u) << name << ": a fast link gets the best level";
  }
}

TEST(Estimator, OracleReproducesTrace) {
  auto trace = std::make_shared<const LinkTrace>(LinkTrace{{{0, 8e9}, {0.5, 1e8}, {1.25, 0}, {2, 4e9}}, 0.001});
  auto o = est("oracle", {.trace = trace});
  for (double start : {0.0, 0.3, 0.499, 0.7, 1.3, 1.999, 5.0})
    for (uint64_t bytes : {uint64_t(1000), 1 * kMB, 50 * kMB, 600 * kMB}) {
      auto p = o->predict_at(bytes, start);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_DOUBLE_EQ(start + p->seconds, *trace->transfer_end(start, bytes)) << start << " " << bytes;
      EXPECT_EQ(p->uncertainty_seconds, 0);
    }
  // Hand-checked: 10 MB at 0.499 + 1 ms: 9.375 MB at 12.5 MB/s until the outage at
  // 1.25, then 0.625 MB at 500 MB/s from 2: ends at 2.00125.
  EXPECT_NEAR(o->predict_at(10 * kMB, 0.499)->seconds, 2.00125 - 0.499, 1e-9);
  // Without a start: right after the last observed transfer.
  ASSERT_TRUE(o->observe(kMB, 0.2, 1.3).ok());
  EXPECT_DOUBLE_EQ(o->predict(kMB)->seconds, o->predict_at(kMB, 1.3)->seconds);
}

namespace {
// Feeds transfers of `bytes` back to back from t=0 over `trace`; returns relative
// prediction error (predicted / true - 1) after each one, for a transfer at the low rate.
std::vector<double> follow_errors(Estimator& e, const LinkTrace& trace, uint64_t bytes, int n, double low_bps) {
  std::vector<double> errs;
  double t = 0;
  for (int i = 0; i < n; ++i) {
    double end = *trace.transfer_end(t, bytes);
    EXPECT_TRUE(e.observe(bytes, t, end).ok());
    t = end;
    errs.push_back(e.predict(bytes)->seconds / (double(bytes) * 8 / low_bps) - 1);
  }
  return errs;
}
}  // namespace

TEST(Estimator, FollowsSuddenDrop) {
  const uint64_t bytes = 10 * kMB;
  // 80 ms of 8 Gbit/s (8 transfers of 10 ms), then 1 Gbit/s forever.
  LinkTrace trace{{{0, 8 * kGbit}, {0.08, 1 * kGbit}}};
  auto last = est("last");
  auto errs = follow_errors(*last, trace, bytes, 12, kGbit);
  // Transfer 8 (index 8) is the first entirely after the drop: "last" is exact after it.
  EXPECT_NEAR(errs[8], 0, 1e-9);
  auto ewma = est("ewma");
  errs = follow_errors(*ewma, trace, bytes, 14, kGbit);
  EXPECT_LT(std::abs(errs[8 + 3]), 0.10) << "ewma within 10% after 4 slow transfers";
  EXPECT_LT(errs[8], -0.4) << "and not after one (it smooths)";
  auto harm = est("harmonic", {.window = 4});
  errs = follow_errors(*harm, trace, bytes, 14, kGbit);
  EXPECT_NEAR(errs[8 + 3], 0, 1e-9) << "harmonic of a window of 4 is exact after 4";
}

TEST(Simulator, ChooserLowersLevelAfterDrop) {
  // 8 Gbit/s, then 0.4 Gbit/s from 50 ms: level 0 (24 MB) takes 24 ms before, 480 ms after.
  LinkTrace trace{{{0, 8 * kGbit}, {0.05, 0.4 * kGbit}}, 0.001};
  SimConfig cfg{trace, study_costs(false), 0, 1.0};
  for (const char* name : {"last", "ewma"}) {
    auto e = est(name, {.prior_bits_per_second = 8 * kGbit});
    auto r = simulate(cfg, *e, DeadlineChooser{ChooserOptions{.k = 0}});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->chunks[0].choice.level, 0u) << name;
    // The first chunk whose transfer ends after the drop was observed slow; the next
    // chunk ("last") or the one after (ewma, which smooths) must be at a lower level.
    size_t first_slow = 0;
    while (r->chunks[first_slow].wire_end_s <= 0.05) ++first_slow;
    const size_t lowered_by = first_slow + (std::string_view(name) == "last" ? 1 : 2);
    ASSERT_LT(lowered_by, r->chunks.size());
    EXPECT_GT(r->chunks[lowered_by].choice.quality_loss, r->chunks[0].choice.quality_loss)
        << name << ": chunk " << lowered_by;
    for (size_t i = 0; i < r->chunks.size(); ++i)
      std::printf("  %-5s chunk %zu: level %u loss %.1f wire %.3f-%.3f %s\n", name, i, r->chunks[i].choice.level,
                  r->chunks[i].choice.quality_loss, r->chunks[i].wire_start_s, r->chunks[i].wire_end_s,
                  r->chunks[i].choice.note.c_str());
  }
}

TEST(EstimatorSet, PerPeerAndThreadSafe) {
  EXPECT_EQ(EstimatorSet::create("nope").status().code(), StatusCode::not_found);
  auto set = EstimatorSet::create("harmonic", {.window = 16});
  ASSERT_TRUE(set.ok()) << set.status();
  auto& s = **set;
  EXPECT_EQ(s.predict("a", 100).status().code(), StatusCode::unavailable);
  EXPECT_EQ(s.observe("", 1, 0, 1).code(), StatusCode::invalid_argument);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&s, t] {
      const std::string peer = t % 2 ? "node-b" : "node-a";
      const double secs_per_mb = t % 2 ? 0.008 : 0.001;  // 1 Gbit/s vs 8 Gbit/s
      for (int i = 0; i < 500; ++i) {
        ASSERT_TRUE(s.observe(peer, kMB, i, i + secs_per_mb).ok());
        ASSERT_TRUE(s.predict(peer, kMB).ok());
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(s.peers(), (std::vector<std::string>{"node-a", "node-b"}));
  EXPECT_NEAR(s.predict("node-a", 10 * kMB)->seconds, 0.01, 1e-9);
  EXPECT_NEAR(s.predict("node-b", 10 * kMB)->seconds, 0.08, 1e-9);
  uint64_t n = 0;
  ASSERT_TRUE(s.with("node-a", [&](Estimator& e) { n = e.observations(); }).ok());
  EXPECT_EQ(n, 1000u);
  EXPECT_EQ(s.estimator_name(), "harmonic");
}

}  // namespace kvstream::test_policy

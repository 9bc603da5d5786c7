// The policy layer: estimators (registry, per-peer set, bad inputs, convergence,
// rate drops, oracle), choosers (deadline feasibility, text fallback, quality floor)
// and the trace-driven simulator, plus a deterministic mini-study against CacheGen's
// chooser.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <ostream>
#include <thread>

#include "kvstream/policy.hpp"
#include "tests/policy/fixed_estimator.hpp"

using namespace kvstream;
using namespace kvstream::policy;
using kvstream::policy::test::FixedEstimator;

namespace {

constexpr double kGbit = 1e9;
constexpr uint64_t kMB = 1000 * 1000;

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

LinkTrace constant_link(double bps, double latency = 0) { return LinkTrace{{{0, bps}}, latency}; }

// 8 chunks x 4 levels (level 0 best, largest), from a fixed table.
ContextCosts study_costs(bool with_text = true) {
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
LinkTrace random_trace(SplitMix& rng, double horizon_s = 30, bool log_uniform = true, double latency_s = 0.002) {
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

std::unique_ptr<Estimator> est(std::string_view name, EstimatorOptions o = {}) {
  auto e = make_estimator(name, o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

}  // namespace

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

// ---- Choosers -----------------------------------------------------------------------------

TEST(Chooser, PicksBestLevelThatFitsWithReserve) {
  ContextCosts c = study_costs(false);
  c.decode_seconds.clear();
  DeadlineChooser ch{ChooserOptions{.k = 0, .reserve_factor = 1, .slack_share = 1}};  // greedy, reserve as predicted
  SplitMix rng{7};
  int checked = 0, fallbacks = 0;
  for (int i = 0; i < 2000; ++i) {
    const double bps = kGbit * rng.uniform(0.1, 8);
    const uint32_t chunk = uint32_t(rng.next() % 8);
    const double left = rng.uniform(0, 1.2);
    FixedEstimator e(bps);
    auto r = ch.choose(c, {chunk, 0, left, 0}, e);
    ASSERT_TRUE(r.ok()) << r.status();
    // Independent check: level l fits iff its time + the smallest level of each later
    // chunk fits in the time left.
    double rest = 0;
    for (uint32_t j = chunk + 1; j < 8; ++j) rest += double(c.level_bytes[j][3]) * 8 / bps;
    int best = -1;
    for (int l = 0; l < 4; ++l)
      if (double(c.level_bytes[chunk][size_t(l)]) * 8 / bps + rest <= left * (1 - 1e-12)) {
        best = l;
        break;
      }
    if (best >= 0) {
      ++checked;
      EXPECT_TRUE(r->fits);
      EXPECT_EQ(int(r->level), best) << "bps " << bps << " chunk " << chunk << " left " << left;
      EXPECT_LE(r->predicted_total_seconds, left);
    } else {
      ++fallbacks;
      EXPECT_FALSE(r->fits);
      EXPECT_EQ(r->level, 3u) << "nothing fits and no text: the smallest level";
      EXPECT_NE(r->note.find("nothing fits"), std::string::npos);
    }
  }
  EXPECT_GT(checked, 200);
  EXPECT_GT(fallbacks, 50);
}

TEST(Simulator, NeverMissesWhenExactPredictionsSayItFits) {
  // With exact predictions (oracle, k = 0), once chunk 0 fits, every later chunk can
  // keep the reserve plan: the deadline is met. Over random traces, decode overlapped.
  SplitMix rng{42};
  int fitted = 0;
  for (int i = 0; i < 200; ++i) {
    auto trace = std::make_shared<const LinkTrace>(random_trace(rng));
    auto o = est("oracle", {.trace = trace});
    SimConfig cfg{*trace, study_costs(i % 2 == 0), 0, 1.0};
    auto r = simulate(cfg, *o, DeadlineChooser{ChooserOptions{.k = 0, .reserve_factor = 1}});
    ASSERT_TRUE(r.ok()) << r.status();
    if (!r->chunks[0].choice.fits) continue;
    ++fitted;
    EXPECT_LE(r->finish_s, 1.0 + 1e-9) << "trace " << i;
    for (const auto& c : r->chunks) EXPECT_TRUE(c.choice.fits) << "trace " << i;
  }
  EXPECT_GT(fitted, 100);
}

// A chunk's own quality (a progressive chunk's measured distortion) overrides the
// profile's: under a 5% bound, a chunk that codes badly at level 2 is kept at level 1,
// its neighbour that codes as the profile says may take level 2, and shapes that do
// not match the chunks are refused.
TEST(Chooser, EachChunksOwnQualityDecidesWhatTheBoundAllows) {
  ContextCosts c = study_costs(false);
  c.decode_seconds.clear();
  c.chunk_level_quality_loss.assign(8, c.level_quality_loss);
  c.chunk_level_quality_loss[3] = {1.0, 3.0, 8.0, 20.0};  // twice the profile's loss
  FixedEstimator slow(0.2 * kGbit);  // nothing fits in 1 ms: each takes its smallest allowed level
  for (const Chooser* ch : std::initializer_list<const Chooser*>{new DeadlineChooser(ChooserOptions{.max_quality_loss = 5.0}),
                                                                new PaperChooser(ChooserOptions{.max_quality_loss = 5.0})}) {
    auto r3 = ch->choose(c, {3, 0, 0.001, 0}, slow);
    ASSERT_TRUE(r3.ok()) << r3.status();
    EXPECT_EQ(r3->level, 1u) << ch->name();
    EXPECT_DOUBLE_EQ(r3->quality_loss, 3.0) << ch->name();
    auto r4 = ch->choose(c, {4, 0, 0.001, 0}, slow);
    ASSERT_TRUE(r4.ok()) << r4.status();
    EXPECT_EQ(r4->level, 2u) << ch->name();
    EXPECT_DOUBLE_EQ(r4->quality_loss, 4.0) << ch->name();
    delete ch;
  }
  ContextCosts bad = c;
  bad.chunk_level_quality_loss.pop_back();
  EXPECT_EQ(bad.validate().code(), StatusCode::invalid_argument);
  bad = c;
  bad.chunk_level_quality_loss[2].push_back(1.0);
  EXPECT_EQ(bad.validate().code(), StatusCode::invalid_argument);
  bad = c;
  bad.chunk_level_quality_loss[1][0] = NAN;
  EXPECT_EQ(bad.validate().code(), StatusCode::invalid_argument);
}

TEST(Chooser, FallsBackToTextWhenNothingFitsAndTextIsFaster) {
  ContextCosts c = study_costs(true);  // 1024 tokens at 3000 tok/s: 0.34 s per text chunk
  FixedEstimator slow(0.05 * kGbit);   // level 3 (3 MB): 0.48 s
  for (const Chooser* ch : std::initializer_list<const Chooser*>{new DeadlineChooser, new PaperChooser}) {
    auto r = ch->choose(c, {0, 0, 0.2, 0}, slow);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->recompute()) << ch->name();
    EXPECT_FALSE(r->fits) << ch->name();
    EXPECT_NE(r->note.find("nothing fits"), std::string::npos) << r->note;
    // When text is slower than the smallest level: the smallest level.
    FixedEstimator medium(0.5 * kGbit);  // level 3: 0.048 s
    r = ch->choose(c, {0, 0, 0.01, 0}, medium);
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->recompute()) << ch->name();
    EXPECT_EQ(r->level, 3u) << ch->name();
    EXPECT_FALSE(r->fits);
    delete ch;
  }
  // On the simulator: a 20 Mbit/s link (3 MB: 1.2 s) where nothing fits: mostly text;
  // once the recompute queue is longer than a transfer, the idle wire takes level 3.
  auto e = est("last", {.prior_bits_per_second = 0.02 * kGbit});
  auto r = simulate({constant_link(0.02 * kGbit), study_costs(true), 0, 1.0}, *e, DeadlineChooser{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(r->recomputed, 5u);
  for (const auto& c : r->chunks) EXPECT_TRUE(c.choice.recompute() || c.choice.level == 3);
  EXPECT_TRUE(r->violated) << "8 x 0.34 s of recompute cannot meet 1 s";
  EXPECT_EQ(r->fallbacks, 8u);
}

TEST(Chooser, TextChosenWhenItFitsAndIsBest) {
  // Text is exact (loss 0): with plenty of time, the last chunk may be recomputed.
  ContextCosts c = study_costs(true);
  FixedEstimator fast(8 * kGbit);
  auto r = DeadlineChooser{}.choose(c, {7, 0, 1.0, 0}, fast);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->recompute());
  EXPECT_TRUE(r->fits);
}

// A context shaped like the adapt benchmark's: mistral-7b, 12 chunks of 512 tokens,
// 11 levels (3.5-23.4 MB per chunk), decode 2.5 ns per encoded byte, text at 5000 tok/s
// (0.1 s per chunk: all text takes 1.23 s, over a 1 s deadline).
ContextCosts mistral_costs() {
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

TEST(Chooser, RecomputesBesideTheWireWhenNeitherAloneFits) {
  // 0.1 Gbit/s: the smallest level of 12 chunks takes 3.4 s on the wire, text alone
  // 1.23 s; text for the first chunks while the wire fetches the last ones fits 1 s.
  ContextCosts c = mistral_costs();
  FixedEstimator slow(0.1 * kGbit);
  auto r = DeadlineChooser{}.choose(c, {0, 0, 1.0, 0}, slow);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->recompute());
  EXPECT_TRUE(r->fits) << r->note;
  EXPECT_LE(r->predicted_total_seconds, 1.0);
  // Played out on a constant link: a text prefix and a few fetched chunks, in time.
  auto e = est("ewma", {.prior_bits_per_second = 0.1 * kGbit});
  auto sim = simulate({constant_link(0.1 * kGbit), c, 0, 1.0}, *e, DeadlineChooser{});
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_FALSE(sim->violated) << "finished at " << sim->finish_s << " s";
  EXPECT_GE(sim->recomputed, 8u);
  EXPECT_LT(sim->recomputed, 12u) << "text alone misses: some chunks must come over the wire";
  // A text chunk's recompute waits for every earlier chunk (its attention needs them).
  double in_memory = 0;
  for (const auto& ch : sim->chunks) {
    if (ch.choice.recompute()) EXPECT_GE(ch.decode_start_s, in_memory - 1e-12);
    in_memory = std::max(in_memory, ch.decode_end_s);
  }
}

TEST(Chooser, CountsTheWireAndRecomputeBacklogs) {
  ContextCosts c = mistral_costs();
  FixedEstimator link(2 * kGbit);
  DeadlineChooser ch;
  auto idle = ch.choose(c, {0, 0, 1.0, 0}, link);
  ASSERT_TRUE(idle.ok()) << idle.status();
  // The same chunk decided while 0.3 s of earlier transfers are still on the wire: the
  // chooser has less time for this one and the rest, so it gives up quality.
  ChooseState busy{0, 0, 1.0, 0};
  busy.wire_backlog_s = 0.3;
  auto late = ch.choose(c, busy, link);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_GT(late->predicted_total_seconds, idle->predicted_total_seconds);
  EXPECT_GE(late->quality_loss, idle->quality_loss);
  // A recompute lane busy for the whole deadline: text cannot fit.
  ChooseState text_busy{11, 0, 0.2, 0};
  text_busy.recompute_backlog_s = 0.5;
  auto t = ch.choose(c, text_busy, link);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->recompute());
  for (double bad : {-1.0, double(NAN)}) {
    ChooseState s{0, 0, 1, 0};
    s.wire_backlog_s = bad;
    EXPECT_EQ(ch.choose(c, s, link).status().code(), StatusCode::invalid_argument);
    s = {0, 0, 1, 0};
    s.recompute_backlog_s = bad;
    EXPECT_EQ(ch.choose(c, s, link).status().code(), StatusCode::invalid_argument);
  }
}

// Asked for the soonest first token (a deadline already due), the chunk-soonest rule
// fetches everything (a text chunk takes 0.1 s, a fetched one 37 ms), while the
// context-soonest plan recomputes a text prefix from t = 0 beside the fetch of the
// suffix, which does not wait for it: 12 x 28 ms on the wire against 2-3 x 0.1 s.
TEST(Chooser, WhenLateTheContextSoonestPlanRecomputesAPrefixBesideTheFetch) {
  const ContextCosts c = mistral_costs();
  auto run = [&](bool context) {
    auto e = est("ewma", {.prior_bits_per_second = kGbit});
    auto r = simulate({constant_link(kGbit), c, 0, 1e-6}, *e,
                      DeadlineChooser{ChooserOptions{.late_completes_context = context}});
    EXPECT_TRUE(r.ok()) << r.status();
    return std::move(r).value();
  };
  const SimResult chunkwise = run(false), planned = run(true);
  EXPECT_EQ(chunkwise.recomputed, 0u);
  ASSERT_GE(planned.recomputed, 1u);
  EXPECT_LT(planned.recomputed, 12u);
  for (uint32_t i = 0; i < 12; ++i) EXPECT_EQ(planned.chunks[i].choice.recompute(), i < planned.recomputed) << i;
  EXPECT_EQ(planned.chunks[0].decode_start_s, 0.0) << "the prefix waits for no KV";
  EXPECT_EQ(planned.chunks[planned.recomputed].wire_start_s, 0.0) << "the suffix does not wait for the prefix";
  EXPECT_LT(planned.finish_s, chunkwise.finish_s);
  EXPECT_LT(planned.finish_s, 12 * 0.1 * 0.5) << "both lanes at work: under half of all-text";
}

// Decode workers side by side: a long context drains as fast as they allow, while a
// single chunk still takes a whole decode. Costs: one level, 1 MB, 0.1 s to decode on
// a worker; a link that moves a chunk in 8 ms; text at 0.15 s per chunk.
TEST(Chooser, DecodeWorkersDrainSideBySideButOneChunkTakesItsWholeDecode) {
  auto costs = [](uint32_t chunks, uint32_t workers, bool text) {
    ContextCosts c;
    c.level_quality_loss = {0.1};
    c.level_bytes.assign(chunks, {kMB});
    c.decode_seconds.assign(chunks, {0.1});
    c.decode_workers = workers;
    if (text) c.tokens.assign(chunks, 1500), c.recompute_tokens_per_second = 10000;
    return c;
  };
  FixedEstimator link(1e9);
  DeadlineChooser ch{ChooserOptions{.late_completes_context = true}};
  // Eight chunks, KV only: two workers finish in about half the time of one (the
  // second starts with the second chunk's landing), in the prediction and in the
  // simulation; the simulated decodes overlap.
  for (uint32_t workers : {1u, 2u}) {
    auto r = ch.choose(costs(8, workers, false), {0, 0, 0, 0}, link);
    ASSERT_TRUE(r.ok()) << r.status();
    const double finish = workers == 1 ? 0.008 + 0.8 : 0.016 + 0.4;
    EXPECT_NEAR(r->predicted_total_seconds, finish, 1e-9) << workers;
    auto sim = simulate({constant_link(1e9), costs(8, workers, false), 0, 1e-6}, link, ch);
    ASSERT_TRUE(sim.ok()) << sim.status();
    EXPECT_NEAR(sim->finish_s, finish, 1e-6) << workers;
    if (workers == 2) EXPECT_LT(sim->chunks[1].decode_start_s, sim->chunks[0].decode_end_s);
  }
  // One chunk: KV takes 0.108 s on any number of workers, text 0.15 s: KV. Make text
  // faster than a whole decode but slower than half of one: text, even with two
  // workers (a model that divided the decode by the workers would fetch).
  ContextCosts one = costs(1, 2, true);
  auto r = ch.choose(one, {0, 0, 0, 0}, link);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->recompute());
  one.recompute_tokens_per_second = 1500 / 0.08;
  r = ch.choose(one, {0, 0, 0, 0}, link);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->recompute());
  // Worker backlogs: one worker busy for 1 s, the other free: the chunk goes to the
  // free one. Both busy: it waits.
  ChooseState st{0, 0, 0, 0};
  st.decode_worker_backlog_s = {1.0, 0.0};
  r = ch.choose(costs(1, 2, false), st, link);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->predicted_seconds, 0.108, 1e-9);
  st.decode_worker_backlog_s = {1.0, 0.5};
  r = ch.choose(costs(1, 2, false), st, link);
  EXPECT_NEAR(r->predicted_seconds, 0.6, 1e-9);
  st.decode_worker_backlog_s = {1.0};
  EXPECT_EQ(ch.choose(costs(1, 2, false), st, link).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(ch.choose(costs(1, 0, false), {0, 0, 0, 0}, link).status().code(), StatusCode::invalid_argument);
}

TEST(Chooser, QualityFloorAndBadInputs) {
  ContextCosts c = study_costs(false);
  FixedEstimator slow(0.01 * kGbit);
  DeadlineChooser floor{ChooserOptions{.max_quality_loss = 4.0}};
  auto r = floor.choose(c, {0, 0, 0.1, 0}, slow);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->level, 2u) << "never worse than the floor, even when late";
  EXPECT_FALSE(r->fits);
  auto r2 = PaperChooser{ChooserOptions{.max_quality_loss = 4.0}}.choose(c, {0, 0, 0.1, 0}, slow);
  EXPECT_EQ(r2->level, 2u);
  DeadlineChooser impossible{ChooserOptions{.max_quality_loss = 0.1}};
  EXPECT_EQ(impossible.choose(c, {0, 0, 1, 0}, slow).status().code(), StatusCode::invalid_argument);

  DeadlineChooser ch;
  EXPECT_EQ(ch.choose(c, {8, 0, 1, 0}, slow).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(ch.choose(c, {0, 0, 1, -1}, slow).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(ch.choose(c, {0, 0, NAN, 0}, slow).status().code(), StatusCode::invalid_argument);
  ContextCosts bad = c;
  bad.level_bytes[3][1] = 0;
  EXPECT_EQ(ch.choose(bad, {0, 0, 1, 0}, slow).status().code(), StatusCode::invalid_argument);
  bad = c;
  bad.level_bytes[2].pop_back();
  EXPECT_EQ(ch.choose(bad, {0, 0, 1, 0}, slow).status().code(), StatusCode::invalid_argument);
  bad = c;
  bad.recompute_tokens_per_second = 100;
  bad.tokens.clear();
  EXPECT_EQ(ch.choose(bad, {0, 0, 1, 0}, slow).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(make_chooser("fancy").status().code(), StatusCode::not_found);
  EXPECT_EQ(make_chooser("deadline", {.k = -1}).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(make_chooser("deadline", {.reserve_factor = 0.5}).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(make_chooser("deadline", {.slack_share = 2}).status().code(), StatusCode::invalid_argument);
  EXPECT_TRUE(make_chooser("paper").ok());

  // No estimate at all: the smallest level, said so.
  FixedEstimator none(0);
  auto r3 = ch.choose(c, {0, 0, 1, 0}, none);
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(r3->level, 3u);
  EXPECT_FALSE(r3->fits);

  // Simulator inputs.
  auto e = est("last");
  EXPECT_EQ(simulate({LinkTrace{}, c, 0, 1}, *e, ch).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(simulate({constant_link(1e9), c, -1, 1}, *e, ch).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(simulate({constant_link(1e9), c, 0, 0}, *e, ch).status().code(), StatusCode::invalid_argument);
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

// ---- Mini-study ---------------------------------------------------------------------------

TEST(Study, DeadlineChooserVersusPaper) {
  // 200 random traces (log-uniform 0.1-8 Gbit/s, changing every 0.5-2 s, 2 ms
  // latency), 1 s deadline, 8 chunks x 4 levels from a fixed table (24/12/6/3 MB
  // scaled per chunk, loss 0.5/1.5/4/10 %), decode 6-14 ms overlapped, text at 3000
  // tok/s (1024 tokens per chunk, loss 0). Every estimator starts from a 1 Gbit/s prior.
  // "deadline" uses its defaults (k = 1, reserve x2, equal share of the slack).
  struct Arm {
    const char* label;
    const char* estimator;
    const char* chooser;
    ChooserOptions opt;
    int violations = 0;
    double loss = 0, finish = 0;
    int text = 0, fallbacks = 0;
  };
  std::vector<Arm> arms = {
      {"paper + last", "last", "paper", {}},
      {"paper + oracle", "oracle", "paper", {}},
      {"deadline + last", "last", "deadline", {}},
      {"deadline + ewma", "ewma", "deadline", {}},
      {"deadline + harmonic", "harmonic", "deadline", {}},
      {"deadline + percentile", "percentile", "deadline", {}},
      {"deadline + oracle", "oracle", "deadline", {.k = 0}},
      // Ablations: no hedge on the reserve; greedy slack use; both.
      {"ewma, reserve x1", "ewma", "deadline", {.reserve_factor = 1}},
      {"ewma, greedy slack", "ewma", "deadline", {.slack_share = 1}},
      {"ewma, greedy, x1", "ewma", "deadline", {.reserve_factor = 1, .slack_share = 1}},
  };
  constexpr int kTraces = 200;
  const std::vector<Arm> fresh = arms;
  // Without text first (printed only: isolates the level choice), then the asserted run.
  for (bool with_text : {false, true}) {
    arms = fresh;
    SplitMix rng{2024};
    for (int i = 0; i < kTraces; ++i) {
      auto trace = std::make_shared<const LinkTrace>(random_trace(rng));
      SimConfig cfg{*trace, study_costs(with_text), 0, 1.0};
      for (auto& a : arms) {
        auto e = est(a.estimator, {.prior_bits_per_second = 1 * kGbit, .trace = trace});
        auto ch = make_chooser(a.chooser, a.opt);
        ASSERT_TRUE(ch.ok());
        auto r = simulate(cfg, *e, **ch);
        ASSERT_TRUE(r.ok()) << r.status();
        a.violations += r->violated;
        a.loss += r->mean_quality_loss / kTraces;
        a.finish += r->finish_s / kTraces;
        a.text += int(r->recomputed);
        a.fallbacks += int(r->fallbacks);
      }
    }
    std::printf("\n  recompute %s\n  %-24s %10s %14s %12s %10s %10s\n", with_text ? "on (3000 tok/s)" : "off", "arm", "violations", "mean loss %", "mean finish", "text",
                "fallbacks");
    for (const auto& a : arms)
      std::printf("  %-24s %6d/%-3d %14.3f %11.3fs %10d %10d\n", a.label, a.violations, kTraces, a.loss, a.finish,
                  a.text, a.fallbacks);
  }
  const Arm& paper = arms[0];
  for (const Arm* ours : {&arms[3], &arms[5]}) {
    EXPECT_LE(ours->violations, paper.violations) << ours->label;
    EXPECT_LE(ours->loss, paper.loss + 1e-12) << ours->label;
  }
}

TEST(Study, MistralGeometryLikeTheShapedLinkRun) {
  // The context of perf/adapt/run.sh (mistral_costs above: 12 x 512 tokens, 11 levels,
  // text at 5000 tok/s) on 300 simulated requests per trace kind, each starting at a
  // random point of its own trace, the estimators warmed by one 8 MB transfer just
  // before. Uniform is the reading of "random rates between 0.1 and 8 Gbit/s";
  // log-uniform spends 37 % of its time below 0.5 Gbit/s.
  struct Arm {
    const char* label;
    const char* estimator;
    const char* chooser;
    int violations = 0;
    double loss = 0;
    int text = 0;
  };
  for (bool log_uniform : {false, true}) {
    std::vector<Arm> arms = {{"paper + last", "last", "paper"},
                             {"deadline + last", "last", "deadline"},
                             {"deadline + ewma", "ewma", "deadline"},
                             {"deadline + percentile", "percentile", "deadline"},
                             {"deadline + oracle", "oracle", "deadline"}};
    constexpr int kRequests = 300;
    SplitMix rng{log_uniform ? 77u : 78u};
    for (int i = 0; i < kRequests; ++i) {
      const LinkTrace t = random_trace(rng, 40, log_uniform, 0.0005);
      auto trace = std::make_shared<const LinkTrace>(t);
      const double start = rng.uniform(1, 30);
      for (auto& a : arms) {
        const bool oracle = std::string_view(a.estimator) == "oracle";
        auto e = est(a.estimator, {.prior_bits_per_second = 1 * kGbit, .trace = trace});
        if (!oracle) {
          auto end = t.transfer_end(start - 0.3, 8 * kMB);
          ASSERT_TRUE(end.ok());
          ASSERT_TRUE(e->observe(8 * kMB, start - 0.3, *end).ok());
        }
        auto ch = make_chooser(a.chooser, {.k = oracle ? 0.0 : 1.0});
        ASSERT_TRUE(ch.ok());
        auto r = simulate({t, mistral_costs(), start, 1.0}, *e, **ch);
        ASSERT_TRUE(r.ok()) << r.status();
        a.violations += r->violated;
        a.loss += r->mean_quality_loss / kRequests;
        a.text += int(r->recomputed);
      }
    }
    std::printf("\n  %s traces, 1 s deadline\n  %-24s %10s %12s %10s\n", log_uniform ? "log-uniform" : "uniform", "arm",
                "violations", "mean loss %", "text/req");
    for (const auto& a : arms)
      std::printf("  %-24s %6d/%-3d %12.3f %10.1f\n", a.label, a.violations, kRequests, a.loss,
                  double(a.text) / kRequests);
    const Arm& paper = arms[0];
    for (size_t k = 1; k + 1 < arms.size(); ++k) {
      EXPECT_LT(arms[k].violations, paper.violations) << arms[k].label;
      EXPECT_LE(arms[k].loss, paper.loss) << arms[k].label;
    }
  }
}

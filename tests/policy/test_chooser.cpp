// The choosers: the deadline chooser picks the best level that fits with its reserve
// (checked against an independent computation), never misses a deadline that exact
// predictions say it meets, honours each chunk's own quality and a quality floor,
// falls back to text or recomputes beside the wire when neither alone fits, counts the
// wire, recompute and decode-worker backlogs, and rejects bad inputs. A fixed-rate
// estimator isolates the choice from estimation; the simulator plays choices out.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kvstream/policy.hpp"
#include "tests/policy/fixed_estimator.hpp"
#include "tests/policy/policy_inputs.hpp"

namespace kvstream::test_chooser {

using namespace kvstream::policy;
using namespace kvstream::policy::test;  // policy_inputs.hpp, fixed_estimator.hpp

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

}  // namespace kvstream::test_chooser

// The policy over progressive chunks, whose every prefix is an option: the deadline
// chooser picks any prefix length (hundreds per chunk, not a few levels), and the
// refinement planner upgrades a fetched context within a time budget, best quality
// per second first.
#include <gtest/gtest.h>

#include "kvstream/policy.hpp"
#include "tests/policy/fixed_estimator.hpp"

namespace kvstream::test_prefix_policy {

using namespace kvstream::policy;
using kvstream::policy::test::FixedEstimator;

namespace {

constexpr double kGbit = 1e9;

// `chunks` progressive chunks of `points` prefixes each, finest (option 0) first:
// option l holds (points - l) x 100 kB and loses l x 0.05 (chunk c's loss scaled by
// `loss_scale[c]` when given), decode free.
ContextCosts prefix_costs(uint32_t chunks, uint32_t points, std::vector<double> loss_scale = {}) {
  ContextCosts c;
  for (uint32_t l = 0; l < points; ++l) c.level_quality_loss.push_back(0.05 * l);
  for (uint32_t i = 0; i < chunks; ++i) {
    std::vector<uint64_t> b;
    std::vector<double> q;
    for (uint32_t l = 0; l < points; ++l) {
      b.push_back(uint64_t(points - l) * 100000);
      q.push_back(0.05 * l * (loss_scale.empty() ? 1.0 : loss_scale[i]));
    }
    c.level_bytes.push_back(b);
    c.chunk_level_quality_loss.push_back(q);
  }
  return c;
}

TEST(PrefixChooser, PicksTheLongestPrefixThatFits) {
  // One chunk of 200 prefixes, 1 Gbit/s, 0.1 s: at most 12.5 MB, option 75 (12.5 MB).
  const ContextCosts c = prefix_costs(1, 200);
  const DeadlineChooser ch;
  auto r = ch.choose(c, {0, 0, 0.1, 0}, FixedEstimator(kGbit));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->fits);
  EXPECT_EQ(r->level, 75u);
  EXPECT_DOUBLE_EQ(r->quality_loss, 0.05 * 75);
  // A little more time: a longer prefix, one option at a time.
  r = ch.choose(c, {0, 0, 0.1008, 0}, FixedEstimator(kGbit));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->level, 74u);
}

TEST(PrefixChooser, ManyPrefixesPerChunkKeepTheDeadline) {
  // 12 chunks of 193 prefixes (mistral-7b's 512-token chunks: a base and 3 x 64
  // groups): every choice fits, and the context's time is within the deadline.
  const ContextCosts c = prefix_costs(12, 193);
  const DeadlineChooser ch;
  const FixedEstimator link(2 * kGbit);
  double used = 0;
  for (uint32_t i = 0; i < 12; ++i) {
    auto r = ch.choose(c, {i, -1, 0.5 - used, 0}, link);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->fits) << "chunk " << i;
    EXPECT_LE(r->predicted_total_seconds, 0.5 - used + 1e-9);
    used += double(c.level_bytes[i][r->level]) * 8 / (2 * kGbit);
  }
  EXPECT_LE(used, 0.5 + 1e-9);
  EXPECT_GT(used, 0.5 * 0.9) << "most of the time is spent on quality";
}

TEST(RefinementPlan, NothingWithoutTimeEverythingWithEnough) {
  const ContextCosts c = prefix_costs(4, 10);
  const std::vector<uint32_t> at = {9, 9, 5, kNotFetched};
  const FixedEstimator link(kGbit);
  auto none = plan_refinement(c, at, link, 0.0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->chunks_refined, 0u);
  EXPECT_EQ(none->level, at);
  EXPECT_EQ(none->bytes, 0u);
  auto all = plan_refinement(c, at, link, 10.0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->level, (std::vector<uint32_t>{0, 0, 0, kNotFetched}));
  EXPECT_EQ(all->chunks_refined, 3u);
  EXPECT_EQ(all->bytes, 9u * 100000 * 2 + 5u * 100000);
  EXPECT_DOUBLE_EQ(all->predicted_seconds, double(all->bytes) * 8 / kGbit);
  EXPECT_DOUBLE_EQ(all->quality_loss_before, (0.45 + 0.45 + 0.25) / 3);
  EXPECT_DOUBLE_EQ(all->quality_loss_after, 0.0);
}

TEST(RefinementPlan, TheChunkThatCodesWorstGoesFirst) {
  // Chunk 1 loses 4x what chunk 0 does at every prefix: with time for one upgrade of
  // 5 prefixes (0.5 MB, 4 ms at 1 Gbit/s), it takes chunk 1's.
  const ContextCosts c = prefix_costs(2, 10, {1.0, 4.0});
  const std::vector<uint32_t> at = {9, 9};
  auto r = plan_refinement(c, at, FixedEstimator(kGbit), 0.0041);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->level[0], 9u);
  EXPECT_EQ(r->level[1], 4u);
  EXPECT_LE(r->predicted_seconds, 0.0041);
  EXPECT_LT(r->quality_loss_after, r->quality_loss_before);
}

TEST(RefinementPlan, BadInputsAreClearErrors) {
  const ContextCosts c = prefix_costs(2, 4);
  const FixedEstimator link(kGbit);
  const std::vector<uint32_t> ok = {3, 3};
  EXPECT_EQ(plan_refinement(c, std::vector<uint32_t>{3}, link, 1).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(plan_refinement(c, std::vector<uint32_t>{3, 4}, link, 1).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(plan_refinement(c, ok, link, -1).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(plan_refinement(c, ok, link, NAN).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(plan_refinement(c, ok, link, 1, -1).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(plan_refinement(c, ok, FixedEstimator(0), 1).status().code(), StatusCode::unavailable);
}

}  // namespace

}  // namespace kvstream::test_prefix_policy

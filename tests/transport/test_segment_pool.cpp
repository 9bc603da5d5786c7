// A storage node's segment buffers and its memory budget: a spare buffer (the second
// of a put's two, MemoryBudget::try_acquire) comes from the idle ones first, and new
// only while the budget keeps room for another segment besides; taking one never
// asks the cache for room nor counts as a refusal.
#include <gtest/gtest.h>

#include "kvstream/transport.hpp"
#include "storage/node/memory_budget.hpp"
#include "storage/node/segment_pool.hpp"

namespace kvstream::test_segment_pool {

using namespace kvstream::storage;

namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20;

TEST(MemoryBudget, ASpareLeavesRoomForAnotherAndAsksNoOneForIt) {
  MemoryBudget budget(4 * kMiB);
  int reclaims = 0;
  budget.set_reclaimer([&](uint64_t) { ++reclaims; });
  auto a = budget.acquire(2 * kMiB);
  ASSERT_TRUE(a.ok());
  auto spare = budget.try_acquire(kMiB, kMiB);
  ASSERT_TRUE(spare.has_value());
  EXPECT_EQ(budget.used(), 3 * kMiB);
  EXPECT_EQ(budget.peak(), 3 * kMiB);  // the room left is not counted as held
  EXPECT_FALSE(budget.try_acquire(kMiB, kMiB).has_value());  // it would take the last
  EXPECT_FALSE(budget.try_acquire(5 * kMiB, 0).has_value());
  EXPECT_FALSE(budget.try_acquire(0, 5 * kMiB).has_value());
  EXPECT_EQ(reclaims, 0);
  EXPECT_EQ(budget.refusals(), 0u);
  auto b = budget.acquire(kMiB);  // the room the spare left
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(budget.used(), 4 * kMiB);
  spare.reset();
  EXPECT_EQ(budget.used(), 3 * kMiB);
}

TEST(SegmentPool, ASpareComesIdleFirstThenOnlyWithRoomForAnother) {
  transport::BackendConfig cfg;
  cfg.name = "tcp";
  auto backend = transport::create_backend(cfg);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  MemoryBudget budget(3 * kMiB);
  SegmentPool pool(**backend, budget, kMiB);
  auto first = pool.acquire();
  ASSERT_TRUE(first.ok());
  auto spare = pool.acquire_spare();
  ASSERT_TRUE(spare.valid());
  EXPECT_EQ(spare.span(kMiB).size(), kMiB);
  EXPECT_FALSE(pool.acquire_spare().valid());  // one segment of room must stay
  auto other = pool.acquire();  // another request's
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(budget.used(), 3 * kMiB);
  EXPECT_EQ(budget.refusals(), 0u);
  spare = {};  // idle in the pool, still leased
  auto again = pool.acquire_spare();
  EXPECT_TRUE(again.valid());  // an idle one, though the budget is full
  EXPECT_EQ(budget.used(), 3 * kMiB);
}

}  // namespace

}  // namespace kvstream::test_segment_pool

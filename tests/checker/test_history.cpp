// The checker itself: it must flag each kind of anomaly it exists for, and pass
// histories that are fine however the operations overlap.
#include <gtest/gtest.h>

#include "tests/checker/history.hpp"

using namespace kvstream::checker;

namespace {
Operation put(uint64_t id, uint64_t inv, uint64_t ret, Outcome o = Outcome::ok, uint32_t key = 1) {
  Operation p;
  p.kind = Kind::put, p.key = key, p.context = 0, p.put_id = id, p.invoked = inv, p.returned = ret, p.outcome = o;
  return p;
}
Operation get(uint64_t id, uint64_t inv, uint64_t ret, uint32_t key = 1) {
  Operation g;
  g.kind = Kind::get, g.key = key, g.context = 0, g.put_id = id, g.invoked = inv, g.returned = ret;
  return g;
}
Operation remove(uint64_t inv, uint64_t ret, Outcome o = Outcome::ok) {
  Operation r;
  r.kind = Kind::remove, r.key = 1, r.context = 0, r.invoked = inv, r.returned = ret, r.outcome = o;
  return r;
}
}  // namespace

TEST(History, SequentialAndOverlappingHistoriesPass) {
  EXPECT_TRUE(check({put(1, 1, 2), get(1, 3, 4), put(2, 5, 6), get(2, 7, 8)}).empty());
  // Two overlapping puts: either may be read afterwards.
  EXPECT_TRUE(check({put(1, 1, 4), put(2, 2, 3), get(1, 5, 6)}).empty());
  EXPECT_TRUE(check({put(1, 1, 4), put(2, 2, 3), get(2, 5, 6)}).empty());
  // A put in flight (its connection broke) may or may not be seen.
  EXPECT_TRUE(check({put(1, 1, 2), put(2, 3, 9, Outcome::unknown), get(1, 4, 5)}).empty());
  EXPECT_TRUE(check({put(1, 1, 2), put(2, 3, 9, Outcome::unknown), get(2, 4, 5)}).empty());
  // Nothing before any put, and nothing after a remove.
  EXPECT_TRUE(check({get(0, 1, 2), put(1, 3, 4), remove(5, 6), get(0, 7, 8)}).empty());
}

TEST(History, LostAcknowledgedPutIsFlagged) {
  auto a = check({put(1, 1, 2), put(2, 3, 4), get(1, 5, 6)});
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].op, 2u);
  EXPECT_FALSE(check({put(1, 1, 2), get(0, 3, 4)}).empty()) << "an acknowledged put read as nothing";
}

TEST(History, RefusedPutMustNeverBeRead) {
  EXPECT_FALSE(check({put(1, 1, 2), put(2, 3, 4, Outcome::failed), get(2, 5, 6)}).empty());
}

TEST(History, ResurrectionAfterAcknowledgedRemoveIsFlagged) {
  EXPECT_FALSE(check({put(1, 1, 2), remove(3, 4), get(1, 5, 6)}).empty());
}

TEST(History, TornCorruptAndMisplacedValuesAreFlagged) {
  auto torn = get(1, 3, 4);
  torn.torn = true;
  EXPECT_FALSE(check({put(1, 1, 2), torn}).empty());
  auto corrupt = get(0, 3, 4);
  corrupt.corrupt = true;
  EXPECT_FALSE(check({put(1, 1, 2), corrupt}).empty());
  EXPECT_FALSE(check({put(1, 1, 2, Outcome::ok, 7), get(1, 3, 4, 1)}).empty()) << "value of another key";
  EXPECT_FALSE(check({get(1, 1, 2), put(1, 3, 4)}).empty()) << "read before the put was issued";
}

// The removes a node remembers (storage/node/tombstones.hpp): by age and count, on a
// fake clock; the node's store refuses copies a remembered remove covered. The
// rebalance that hands them to a node coming back runs in test_etcd_membership.cpp.
#include <gtest/gtest.h>

#include "storage/node/chunk_store.hpp"
#include "storage/node/tombstones.hpp"
#include "tests/transport/node_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::storage {
namespace {

using namespace std::chrono_literals;
using transport::Clock;
using transport::test_util::pattern;

TEST(Tombstones, ARemoveIsRememberedAtItsNewestVersionUntilItAgesOrIsPushedOut) {
  Clock::time_point now{};
  Tombstones t({10s, 3}, [&] { return now; });
  t.record("a", "x", 50);
  t.record("a", "x", 40);  // an older remove of it, arriving late
  EXPECT_EQ(t.removed_up_to("a", "x"), 50u);
  EXPECT_EQ(t.removed_up_to("b", "x"), 0u) << "another namespace's context";
  now += 6s;
  t.record("b", "x", 7);
  t.record("a", "y", 9);
  EXPECT_EQ(t.list("a"), (std::vector<std::pair<std::string, uint64_t>>{{"x", 50}, {"y", 9}}));
  EXPECT_EQ(t.list("b"), (std::vector<std::pair<std::string, uint64_t>>{{"x", 7}}));
  now += 5s;  // 11 s after the first record of a/x, 5 s after the others
  EXPECT_EQ(t.removed_up_to("a", "x"), 0u) << "aged out";
  EXPECT_EQ(t.size(), 2u);
  t.record("a", "y", 9);  // recorded again: young again
  t.record("a", "z", 1);
  t.record("a", "w", 2);  // the fourth: the oldest record (b/x) goes
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.removed_up_to("b", "x"), 0u);
  EXPECT_EQ(t.removed_up_to("a", "y"), 9u);
  now += 9s;
  EXPECT_EQ(t.removed_up_to("a", "y"), 9u) << "9 s after its last record";
  now += 2s;
  EXPECT_EQ(t.size(), 0u);
  t.set_limits({0s, 3});
  t.record("a", "x", 5);
  EXPECT_EQ(t.removed_up_to("a", "x"), 0u) << "remembering nothing";
}

TEST(Tombstones, TheStoreRefusesCopiesTheRemoveCovered) {
  node_test_util::TempDir dir("kvstream-tombstones");
  MemoryBudget budget(64 << 20);
  auto opened = ChunkStore::open(dir.path().string(), 1 << 20, budget);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  ChunkStore& st = **opened;
  const ObjectKey k0{"t", "ctx", 0, 0}, k1{"t", "ctx", 1, 0};
  ASSERT_TRUE(st.put(k0, pattern(100, 1), 10).ok());
  ASSERT_TRUE(st.put(k1, pattern(100, 2), 30).ok());
  ASSERT_TRUE(st.remove("t", "ctx", 20).ok());  // k1, written after it, stays
  EXPECT_EQ(st.removed_up_to("t", "ctx"), 20u);
  EXPECT_EQ(st.put(k0, pattern(100, 3), 15).code(), StatusCode::already_exists) << "a copy the remove covered";
  EXPECT_EQ(st.put(k0, pattern(100, 3), 20).code(), StatusCode::already_exists) << "at the remove's version";
  EXPECT_EQ(st.get(k0).status().code(), StatusCode::not_found);
  ASSERT_TRUE(st.put(k0, pattern(100, 4), 21).ok()) << "a write after the remove";
  // An unversioned write (a client from before versions) is newer than the remove.
  const ObjectKey k2{"t", "ctx", 2, 0};
  ASSERT_TRUE(st.put(k2, pattern(100, 5)).ok());
  auto stats = st.stat("t", "ctx");
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->size(), 3u);
  EXPECT_GT((*stats)[2].level_versions.at(0), 20u);

  // A remove of a context this node does not hold is remembered all the same.
  EXPECT_EQ(st.remove("t", "never", 500).code(), StatusCode::not_found);
  EXPECT_EQ(st.put({"t", "never", 0, 0}, pattern(10, 6), 499).code(), StatusCode::already_exists);
  EXPECT_EQ(st.list("t"), std::vector<std::string>{"ctx"});
  // One without a version (a client from before them) is remembered at the newest
  // write it deleted.
  ASSERT_TRUE(st.put({"t", "old", 0, 0}, pattern(10, 7), 60).ok());
  ASSERT_TRUE(st.put({"t", "old", 1, 0}, pattern(10, 8), 70).ok());
  ASSERT_TRUE(st.remove("t", "old").ok());
  EXPECT_EQ(st.removed_up_to("t", "old"), 70u);
  EXPECT_EQ(st.removed(("t")), (std::vector<std::pair<std::string, uint64_t>>{{"ctx", 20}, {"never", 500}, {"old", 70}}));
  // Dropping one surplus copy (the rebalance's trim) is no remove: nothing remembered.
  ASSERT_TRUE(st.put({"t", "copy", 0, 0}, pattern(10, 9), 80).ok());
  ASSERT_TRUE(st.remove_object({"t", "copy", 0, 0}, 80).ok());
  EXPECT_EQ(st.removed_up_to("t", "copy"), 0u);
  EXPECT_TRUE(st.put({"t", "copy", 0, 0}, pattern(10, 9), 80).ok());
  EXPECT_EQ(st.removes_remembered(), 3u);
}

}  // namespace
}  // namespace kvstream::storage

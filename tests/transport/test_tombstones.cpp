// The removes a node remembers (storage/node/tombstones.hpp): by age and count, on a
// fake clock; the node's store refuses copies a remembered remove covered. The
// rebalance that hands them to a node coming back runs in test_etcd_removes.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "storage/node/chunk_store.hpp"
#include "storage/node/tombstone_log.hpp"
#include "storage/node/tombstones.hpp"
#include "tests/transport/node_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::storage {
namespace {

using namespace std::chrono_literals;
using transport::test_util::pattern;
namespace fs = std::filesystem;

TEST(Tombstones, ARemoveIsRememberedAtItsNewestVersionUntilItAgesOrIsPushedOut) {
  Tombstones::Clock::time_point now{};
  Tombstones t({10s, 3}, [&] { return now; });
  ASSERT_TRUE(t.record("a", "x", 50).ok());
  ASSERT_TRUE(t.record("a", "x", 40).ok());  // an older remove of it, arriving late
  EXPECT_EQ(t.removed_up_to("a", "x"), 50u);
  EXPECT_EQ(t.removed_up_to("b", "x"), 0u) << "another namespace's context";
  now += 6s;
  ASSERT_TRUE(t.record("b", "x", 7).ok());
  ASSERT_TRUE(t.record("a", "y", 9).ok());
  EXPECT_EQ(t.list("a"), (std::vector<std::pair<std::string, uint64_t>>{{"x", 50}, {"y", 9}}));
  EXPECT_EQ(t.list("b"), (std::vector<std::pair<std::string, uint64_t>>{{"x", 7}}));
  now += 5s;  // 11 s after the first record of a/x, 5 s after the others
  EXPECT_EQ(t.removed_up_to("a", "x"), 0u) << "aged out";
  EXPECT_EQ(t.size(), 2u);
  ASSERT_TRUE(t.record("a", "y", 9).ok());  // recorded again: young again
  now += 1s;
  ASSERT_TRUE(t.record("a", "z", 1).ok());
  ASSERT_TRUE(t.record("a", "w", 2).ok());  // the fourth: "a" holds the most, its oldest (a/y) goes
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.removed_up_to("b", "x"), 7u) << "another tenant's, though older, stays";
  EXPECT_EQ(t.removed_up_to("a", "y"), 0u);
  EXPECT_EQ(t.list("a"), (std::vector<std::pair<std::string, uint64_t>>{{"w", 2}, {"z", 1}}));
  ASSERT_TRUE(t.record("b", "v", 3).ok());  // now "a" still holds the most: a/z goes
  EXPECT_EQ(t.removed_up_to("a", "z"), 0u);
  EXPECT_EQ(t.removed_up_to("b", "x"), 7u);
  now += 9s;
  EXPECT_EQ(t.removed_up_to("a", "w"), 2u) << "9 s after its last record";
  EXPECT_EQ(t.removed_up_to("b", "x"), 0u) << "aged out";
  now += 2s;
  EXPECT_EQ(t.size(), 0u);
  t.set_limits({0s, 3});
  ASSERT_TRUE(t.record("a", "x", 5).ok());
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
  EXPECT_EQ(st.removed("t"), (std::vector<std::pair<std::string, uint64_t>>{{"ctx", 20}, {"never", 500}, {"old", 70}}));
  // Dropping one surplus copy (the rebalance's trim) is no remove: nothing remembered.
  ASSERT_TRUE(st.put({"t", "copy", 0, 0}, pattern(10, 9), 80).ok());
  ASSERT_TRUE(st.remove_object({"t", "copy", 0, 0}, 80).ok());
  EXPECT_EQ(st.removed_up_to("t", "copy"), 0u);
  EXPECT_TRUE(st.put({"t", "copy", 0, 0}, pattern(10, 9), 80).ok());
  EXPECT_EQ(st.removes_remembered(), 3u);
}

// The file: a restart reads back what was recorded, with its age; a line cut short by
// a crash is skipped, not taken for another remove; the file is rewritten once it
// holds many more lines than removes remembered.
TEST(Tombstones, ARestartRemembersWhatTheFileHolds) {
  node_test_util::TempDir dir("kvstream-tombstones");
  const std::string path = (dir.path() / ".removes").string();
  Tombstones::Clock::time_point now{std::chrono::hours(1000)};
  const auto clock = [&] { return now; };
  {
    Tombstones t({100s, 10}, clock);
    ASSERT_TRUE(t.persist_to(path).ok());
    ASSERT_TRUE(t.record("a", "x", 50).ok());
    now += 60s;
    ASSERT_TRUE(t.record("a", "y", 60).ok());
    ASSERT_TRUE(t.record("b", "x", 70).ok());
  }
  std::ofstream(path, std::ios::app) << "a z 90 1";  // a torn append
  {
    Tombstones t({100s, 10}, clock);
    ASSERT_TRUE(t.persist_to(path).ok());
    t.set_limits({100s, 10});
    EXPECT_EQ(t.list("a"), (std::vector<std::pair<std::string, uint64_t>>{{"x", 50}, {"y", 60}}));
    EXPECT_EQ(t.removed_up_to("b", "x"), 70u);
    now += 50s;  // a/x recorded 110 s ago, the others 50 s
    EXPECT_EQ(t.removed_up_to("a", "x"), 0u) << "its age outlived the restart";
    EXPECT_EQ(t.size(), 2u);
  }
  // Each line verifies; a changed digit does not.
  TombstoneRecord r{"ns", "ctx.1", 12345, 678}, back;
  std::string line = TombstoneLog::format(r);
  ASSERT_TRUE(TombstoneLog::parse(line.substr(0, line.size() - 1), back));
  EXPECT_EQ(back, r);
  line[9] = '9';
  EXPECT_FALSE(TombstoneLog::parse(line.substr(0, line.size() - 1), back));
  EXPECT_FALSE(TombstoneLog::parse("ns ../x 1 2 0000000000000000", back));

  // Many records of a few contexts: the file is rewritten to those alone.
  Tombstones t({1000s, 10}, clock);
  ASSERT_TRUE(t.persist_to(path).ok());
  for (int i = 0; i < 3000; ++i) ASSERT_TRUE(t.record("c", "ctx" + std::to_string(i % 4), uint64_t(i)).ok());
  std::ifstream in(path);
  const auto lines = std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n');
  EXPECT_LT(lines, 1100) << "never rewritten";
  Tombstones again({1000s, 10}, clock);
  ASSERT_TRUE(again.persist_to(path).ok());
  EXPECT_EQ(again.removed_up_to("c", "ctx3"), 2999u);
  EXPECT_EQ(again.removed_up_to("b", "x"), 70u);
}

TEST(Tombstones, AReopenedStoreStillRefusesTheRemovedCopies) {
  node_test_util::TempDir dir("kvstream-tombstones");
  MemoryBudget budget(64 << 20);
  const ObjectKey k{"t", "ctx", 0, 0};
  {
    auto st = ChunkStore::open(dir.path().string(), 1 << 20, budget);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    ASSERT_TRUE((*st)->put(k, pattern(100, 1), 10).ok());
    ASSERT_TRUE((*st)->remove("t", "ctx", 20).ok());
  }
  {
    auto st = ChunkStore::open(dir.path().string(), 1 << 20, budget);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    EXPECT_EQ((*st)->removed_up_to("t", "ctx"), 20u);
    EXPECT_EQ((*st)->put(k, pattern(100, 2), 15).code(), StatusCode::already_exists);
    EXPECT_EQ((*st)->list("t"), std::vector<std::string>{}) << "the file is no namespace";
  }
  // A store whose file cannot be written does not remove.
  fs::remove(dir.path() / ChunkStore::kRemovesFile);
  fs::create_directory(dir.path() / ChunkStore::kRemovesFile);
  EXPECT_EQ(ChunkStore::open(dir.path().string(), 1 << 20, budget).status().code(), StatusCode::io_error);
}

// What a store held when it opened is, once fenced, not served (gets not_found,
// hidden from the stat clients see) until the fence is lifted; writes since the open
// are, and the node's own reads (a rebalance's) see everything.
TEST(Tombstones, WhatAReturningNodeHeldWaitsBehindTheFence) {
  node_test_util::TempDir dir("kvstream-tombstones");
  MemoryBudget budget(64 << 20);
  const ObjectKey a0{"t", "ctx", 0, 0}, a1{"t", "ctx", 0, 1}, b0{"t", "ctx", 1, 0};
  {
    auto first = ChunkStore::open(dir.path().string(), 1 << 20, budget);
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    ASSERT_TRUE((*first)->put(a0, pattern(100, 1), 10).ok());
    ASSERT_TRUE((*first)->put(a1, pattern(0, 2), 10).ok());  // an empty object is an object too
    ASSERT_TRUE((*first)->put(b0, pattern(100, 3), 10).ok());
  }
  auto opened = ChunkStore::open(dir.path().string(), 1 << 20, budget);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  ChunkStore& st = **opened;
  EXPECT_FALSE(st.fenced());
  st.fence_held_at_open();
  EXPECT_TRUE(st.fenced());
  EXPECT_EQ(st.get(a0).status().code(), StatusCode::not_found);
  EXPECT_EQ(st.get(a1).status().code(), StatusCode::not_found);
  EXPECT_EQ(st.stat("t", "ctx", /*hide_fenced=*/true).status().code(), StatusCode::not_found);
  EXPECT_EQ(st.stat("t", "ctx")->size(), 2u) << "the node's own look sees all";
  EXPECT_TRUE(st.read_stored(a0).ok());
  EXPECT_EQ(st.fenced_gets(), 2u);
  // Nor does a client's list or usage name it (kFeatureServedOnly: a returning
  // member's look at what the others serve reads these).
  const auto usage = [&] { return st.usage("t", "", "", 100, 1 << 20); };
  EXPECT_TRUE(st.list("t", /*hide_fenced=*/true).empty());
  EXPECT_EQ(st.list("t"), std::vector<std::string>{"ctx"}) << "the node's own look sees all";
  EXPECT_TRUE(usage().empty());
  // A write after the fence is served; the rest of the context stays behind it.
  ASSERT_TRUE(st.put(b0, pattern(100, 4), 20).ok());
  auto got = st.get(b0);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  auto seen = st.stat("t", "ctx", true);
  ASSERT_TRUE(seen.ok());
  ASSERT_EQ(seen->size(), 1u);
  EXPECT_EQ((*seen)[0].chunk, 1u);
  EXPECT_EQ((*seen)[0].level_versions, std::vector<uint64_t>{20});
  EXPECT_EQ(st.list("t", true), std::vector<std::string>{"ctx"});
  auto listed = usage();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].bytes, 100u) << "the write since the fence alone";
  EXPECT_EQ(listed[0].chunks, std::vector<uint32_t>{1});
  EXPECT_EQ(listed[0].written, 20u);
  st.lift_fence();
  listed = usage();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].bytes, 200u);
  EXPECT_EQ(listed[0].chunks, (std::vector<uint32_t>{0, 1}));
  EXPECT_FALSE(st.fenced());
  EXPECT_TRUE(st.get(a0).ok());
  EXPECT_TRUE(st.get(a1).ok());
  seen = st.stat("t", "ctx", true);
  ASSERT_TRUE(seen.ok());
  ASSERT_EQ(seen->size(), 2u);
  EXPECT_EQ((*seen)[0].level_bytes, (std::vector<uint64_t>{100, 0}));
}

// A node back in its cluster after longer than removes are remembered (member_mark.hpp):
// what it held at start goes, a write since stays; back sooner, it is fenced only. The
// mark is written at most once a minute, and one that does not verify is none.
TEST(Tombstones, ANodeBackAfterLongerThanRemovesAreRememberedDropsWhatItHeld) {
  node_test_util::TempDir dir("kvstream-tombstones");
  MemoryBudget budget(64 << 20);
  const std::string path = dir.path().string();
  const ObjectKey a0{"t", "ctx", 0, 0}, a1{"t", "ctx", 1, 0}, b0{"t", "other", 0, 0};
  const auto t0 = std::chrono::system_clock::time_point(std::chrono::seconds(1'800'000'000));
  {
    auto first = ChunkStore::open(path, 1 << 20, budget);
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    EXPECT_FALSE((*first)->member_at_open()) << "a new store has no mark";
    for (const auto& k : {a0, a1, b0}) ASSERT_TRUE((*first)->put(k, pattern(100, uint8_t(k.chunk + 1)), 10).ok());
    ASSERT_TRUE((*first)->note_member(t0).ok());
    ASSERT_TRUE((*first)->note_member(t0 + 30s).ok());  // within the minute: not written
  }
  EXPECT_EQ(read_member_mark(path), t0);
  const std::chrono::seconds day = 24h;
  {
    auto again = ChunkStore::open(path, 1 << 20, budget);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_EQ((*again)->member_at_open(), t0);
    auto dropped = (*again)->come_back(day, t0 + 23h);
    ASSERT_TRUE(dropped.ok()) << dropped.status().to_string();
    EXPECT_EQ(*dropped, 0u) << "away less than a day: fenced only";
    EXPECT_EQ((*again)->get(a0).status().code(), StatusCode::not_found);
    EXPECT_TRUE((*again)->read_stored(a0).ok());
    dropped = (*again)->come_back(0s, t0 + 1000h);
    ASSERT_TRUE(dropped.ok());
    EXPECT_EQ(*dropped, 0u) << "a node remembering no removes drops nothing for them";
    ASSERT_TRUE((*again)->note_member(t0 + 61s).ok());
  }
  EXPECT_EQ(read_member_mark(path), t0 + 61s);
  {
    auto back = ChunkStore::open(path, 1 << 20, budget);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    ChunkStore& st = **back;
    ASSERT_TRUE(st.put(a0, pattern(100, 9), 20).ok());  // a write since the open
    auto dropped = st.come_back(day, t0 + 61s + day + 1s);
    ASSERT_TRUE(dropped.ok()) << dropped.status().to_string();
    EXPECT_EQ(*dropped, 2u) << "a1 and b0, held at start";
    EXPECT_EQ(st.get(a1).status().code(), StatusCode::not_found);
    EXPECT_EQ(st.read_stored(b0).status().code(), StatusCode::not_found);
    ASSERT_TRUE(st.get(a0).ok());
    auto stored = st.read_stored(a0);
    ASSERT_TRUE(stored.ok()) << stored.status().to_string();
    EXPECT_EQ(stored->bytes, pattern(100, 9));
    EXPECT_EQ(stored->version, 20u);
    EXPECT_EQ(st.list("t"), std::vector<std::string>{"ctx"});
    EXPECT_FALSE(fs::exists(dir.path() / "t" / "other")) << "the emptied context's directory";
    EXPECT_EQ(st.removes_remembered(), 0u) << "a drop is no remove";
  }
  {
    auto reopened = ChunkStore::open(path, 1 << 20, budget);
    ASSERT_TRUE(reopened.ok());
    EXPECT_TRUE((*reopened)->read_stored(a0).ok());
    EXPECT_EQ((*reopened)->read_stored(a1).status().code(), StatusCode::not_found);
    EXPECT_EQ((*reopened)->stat("t", "ctx")->size(), 1u);
  }
  // A mark that does not verify is none: nothing is dropped for it.
  std::ofstream(dir.path() / kMemberMarkFile, std::ios::trunc) << "not a mark, but 24 bytes";
  EXPECT_FALSE(read_member_mark(path));
  auto last = ChunkStore::open(path, 1 << 20, budget);
  ASSERT_TRUE(last.ok());
  EXPECT_FALSE((*last)->member_at_open());
  auto dropped = (*last)->come_back(day, t0 + 1000h);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(*dropped, 0u);
}

// A running node its cluster dropped (its lease ran out) is about to register again:
// everything it holds then waits behind the fence, as at a restart, and goes where it
// was out longer than removes are remembered; a write after either is served, and a
// store remembering no removes drops nothing for them.
TEST(Tombstones, ANodeItsClusterDroppedWhileItRanFencesOrDropsWhatItHolds) {
  node_test_util::TempDir dir("kvstream-tombstones");
  MemoryBudget budget(64 << 20);
  const std::string path = dir.path().string();
  const ObjectKey a0{"t", "ctx", 0, 0}, b0{"t", "ctx", 1, 0}, c0{"t", "new", 0, 0}, d0{"t", "new", 1, 0},
      e0{"t", "last", 0, 0};
  {
    auto opened = ChunkStore::open(path, 1 << 20, budget);
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
    ChunkStore& st = **opened;
    st.set_tombstone_limits({60s, 100});
    ASSERT_TRUE(st.put(a0, pattern(100, 1), 10).ok());
    ASSERT_TRUE(st.put(b0, pattern(100, 2), 10).ok());
    ASSERT_TRUE(st.get(a0).ok()) << "a write of the running store is served";

    auto dropped = st.rejoin(59s);
    ASSERT_TRUE(dropped.ok()) << dropped.status().to_string();
    EXPECT_EQ(*dropped, 0u) << "out less than removes are remembered: fenced only";
    EXPECT_EQ(st.get(a0).status().code(), StatusCode::not_found);
    EXPECT_EQ(st.stat("t", "ctx", /*hide_fenced=*/true).status().code(), StatusCode::not_found);
    EXPECT_TRUE(st.read_stored(b0).ok()) << "the node's own reads see it";
    ASSERT_TRUE(st.put(c0, pattern(100, 3), 20).ok());
    EXPECT_TRUE(st.get(c0).ok()) << "a write after the rejoin";
    st.lift_fence();
    EXPECT_TRUE(st.get(a0).ok());
    EXPECT_TRUE(st.get(b0).ok());

    ASSERT_TRUE(st.put(d0, pattern(100, 4), 20).ok());
    ASSERT_TRUE(st.put(b0, pattern(100, 5), 30).ok());  // rewritten since the first rejoin
    dropped = st.rejoin(61s);
    ASSERT_TRUE(dropped.ok()) << dropped.status().to_string();
    EXPECT_EQ(*dropped, 4u) << "a0, b0, c0 and d0: all it held, old and new";
    for (const auto& k : {a0, b0, c0, d0}) EXPECT_EQ(st.read_stored(k).status().code(), StatusCode::not_found);
    ASSERT_TRUE(st.put(e0, pattern(100, 6), 40).ok());
    EXPECT_TRUE(st.get(e0).ok()) << "a write after the drop";
    EXPECT_EQ(st.removes_remembered(), 0u) << "a drop is no remove";

    st.set_tombstone_limits({0s, 100});
    dropped = st.rejoin(1000h);
    ASSERT_TRUE(dropped.ok());
    EXPECT_EQ(*dropped, 0u) << "a node remembering no removes drops nothing for them";
    EXPECT_EQ(st.get(e0).status().code(), StatusCode::not_found) << "fenced";
  }
  auto reopened = ChunkStore::open(path, 1 << 20, budget);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->list("t"), std::vector<std::string>{"last"});
}

// Where removes of a namespace were pushed out past the bound, the newest of them is
// its horizon: every remove recorded after it (and younger than ttl) is remembered.
// The horizon outlives a restart (in the file once rewritten, derived again from its
// lines before), and goes once older than ttl.
TEST(Tombstones, TheNewestRemovePushedOutIsRememberedAsTheNamespacesHorizon) {
  node_test_util::TempDir dir("kvstream-tombstones");
  const std::string path = (dir.path() / ".removes").string();
  const Tombstones::Clock::time_point t0{std::chrono::hours(1000)};
  Tombstones::Clock::time_point now = t0;
  const auto clock = [&] { return now; };
  {
    Tombstones t({100s, 2}, clock);
    ASSERT_TRUE(t.persist_to(path).ok());
    EXPECT_EQ(t.complete_since("a"), t0 - 100s) << "nothing pushed out: ttl ago";
    ASSERT_TRUE(t.record("a", "x", 1).ok());
    now += 1s;
    ASSERT_TRUE(t.record("a", "y", 1).ok());
    now += 1s;
    ASSERT_TRUE(t.record("b", "z", 1).ok());  // "a" holds the most: a/x (t0) goes
    EXPECT_EQ(t.complete_since("a"), t0);
    EXPECT_EQ(t.complete_since("b"), now - 100s) << "another namespace's";
  }
  {
    // Read back (no rewrite yet): the lines are there, and the bound pushes a/x out
    // again.
    Tombstones t({}, clock);
    ASSERT_TRUE(t.persist_to(path).ok());
    t.set_limits({100s, 2});
    EXPECT_EQ(t.complete_since("a"), t0);
    // Enough more removes of "b" that the file is rewritten: two lines of removes,
    // and one per horizon.
    for (int i = 0; i < 1100; ++i) {
      now += 10ms;
      ASSERT_TRUE(t.record("b", fmt::format("c{}", i), 1).ok());
    }
    EXPECT_EQ(t.complete_since("a"), t0) << "b holds the most: its own go";
    EXPECT_EQ(t.complete_since("b"), now - 10ms) << "the newest of b's pushed out";
  }
  std::ifstream in(path);
  size_t lines = 0, horizons = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    TombstoneRecord r;
    ASSERT_TRUE(TombstoneLog::parse(line, r)) << line;
    horizons += r.horizon();
  }
  EXPECT_LT(lines, 1100u) << "rewritten";
  EXPECT_EQ(horizons, 2u);
  {
    // A larger bound pushes nothing out: the horizon of "a" is the file's line (and
    // the removes of "b" appended since the rewrite are remembered again).
    Tombstones t({}, clock);
    ASSERT_TRUE(t.persist_to(path).ok());
    EXPECT_EQ(t.complete_since("a"), t0);
    EXPECT_EQ(t.removed_up_to("a", "y"), 1u);
    EXPECT_EQ(t.removed_up_to("a", "*"), 0u) << "a horizon is no remove";
    now = t0 + 150s;  // the horizon of "a" is older than ttl now
    t.set_limits({100s, 2});
    EXPECT_EQ(t.complete_since("a"), now - 100s);
    t.set_limits({0s, 2});
    EXPECT_FALSE(t.complete_since("a")) << "remembering none: no claim";
  }
}

// A node back whose members may have forgotten removes made while it was away (a
// horizon later than its last membership): the namespaces that concerns, the contexts
// of them it holds behind the fence, and the drop of the ones picked; the others, and
// writes since, stay and are served once the fence lifts.
TEST(Tombstones, ANodeFindsWhatItHoldsOfNamespacesWhoseRemovesAMemberMayHaveForgotten) {
  node_test_util::TempDir dir("kvstream-tombstones");
  MemoryBudget budget(64 << 20);
  const ObjectKey a0{"t", "ctx", 0, 0}, a1{"t", "ctx", 1, 0}, b0{"t", "live", 0, 0}, u0{"u", "ctx", 0, 0},
      since{"t", "new", 0, 0};
  auto opened = ChunkStore::open(dir.path().string(), 1 << 20, budget);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  ChunkStore& st = **opened;
  for (const auto& k : {a0, a1, b0, u0}) ASSERT_TRUE(st.put(k, pattern(100, uint8_t(k.chunk + 1)), 10).ok());
  const auto now = std::chrono::system_clock::now();
  EXPECT_TRUE(st.forgotten_namespaces({{"t", now}}).empty()) << "nothing behind a fence";
  ASSERT_TRUE(st.rejoin(60s).ok());  // last a member a minute ago
  ASSERT_TRUE(st.put(since, pattern(100, 7), 20).ok());
  EXPECT_TRUE(st.forgotten_namespaces({{"t", now - 120s}, {"u", now - 61s}}).empty()) << "horizons before it left";
  EXPECT_EQ(st.forgotten_namespaces({{"t", now - 30s}, {"u", now - 120s}, {"v", now}}), std::vector<std::string>{"t"})
      << "v: nothing of it held";
  EXPECT_EQ(st.held_contexts("t"), (std::vector<std::string>{"ctx", "live"})) << "not t/new, written since";
  auto dropped = st.drop_held([](const std::string& ns, const std::string& ctx) { return ns == "t" && ctx == "ctx"; });
  ASSERT_TRUE(dropped.ok()) << dropped.status().to_string();
  EXPECT_EQ(*dropped, 2u);
  EXPECT_EQ(st.read_stored(a0).status().code(), StatusCode::not_found);
  EXPECT_EQ(st.read_stored(a1).status().code(), StatusCode::not_found);
  EXPECT_EQ(st.held_contexts("t"), std::vector<std::string>{"live"});
  st.lift_fence();
  EXPECT_TRUE(st.get(b0).ok());
  EXPECT_TRUE(st.get(u0).ok());
  EXPECT_TRUE(st.get(since).ok());
  EXPECT_TRUE(st.forgotten_namespaces({{"t", now}}).empty()) << "the fence lifted";
}

}  // namespace
}  // namespace kvstream::storage

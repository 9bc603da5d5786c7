// Surplus copies (storage/cluster/surplus_copies.hpp): the write versions a stat
// carries on the wire, a node's removal of one object only while it holds the write
// that was checked, and the verdict that keeps every copy an owner lacks. The
// rebalance that drops them runs in test_etcd_membership.cpp. And the rhythm of the
// warning a fenced node gives while its trim waits on other members.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "kvstream/storage.hpp"
#include "storage/cluster/surplus_copies.hpp"
#include "storage/cluster/wait_warning.hpp"
#include "storage/node/chunk_store.hpp"
#include "storage/protocol.hpp"
#include "tests/transport/node_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::storage {
namespace {

using node_test_util::TempDir;
using transport::test_util::pattern;
namespace fs = std::filesystem;

TEST(SurplusCopies, StatVersionsTravelOnlyWhenAsked) {
  Request s;
  s.op = Op::stat, s.id = 4, s.context = "ctx", s.flags = kStatVersions;
  auto back = decode_request(encode(s));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->flags, kStatVersions);
  s.flags = 0;
  EXPECT_EQ(decode_request(encode(s))->flags, 0) << "a client from before flags";
  s.flags = 2;
  EXPECT_EQ(decode_request(encode(s)).status().code(), StatusCode::corrupt_data) << "a flag no node knows";
  Request g;
  g.op = Op::get, g.context = "ctx", g.flags = kStatVersions;
  EXPECT_EQ(decode_request(encode(g)).status().code(), StatusCode::corrupt_data) << "the stat flag on a get";

  const std::vector<ChunkStat> stats = {{0, {100, 0, 30}, {{{60, 1.5}, {100, 0.5}}}, {7, 0, 9}},
                                        {5, {}, {}, {}}};
  const auto with = encode_stats(stats, true);
  auto decoded = decode_stats(with, true);
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  EXPECT_EQ(*decoded, stats);
  for (size_t cut = 0; cut < with.size(); ++cut)
    EXPECT_FALSE(decode_stats(std::span(with).first(cut), true).ok()) << cut;
  // The old form: no versions, and none read.
  const auto without = encode_stats(stats);
  decoded = decode_stats(without);
  ASSERT_TRUE(decoded.ok());
  EXPECT_TRUE((*decoded)[0].level_versions.empty());
  EXPECT_EQ((*decoded)[0].level_bytes, stats[0].level_bytes);
  EXPECT_FALSE(decode_stats(with).ok()) << "versions read as the old form";
  EXPECT_FALSE(decode_stats(without, true).ok()) << "the old form read as versions";
  std::mt19937 rng(11);
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> junk(rng() % 120);
    for (auto& b : junk) b = std::byte(rng());
    (void)decode_stats(junk, true);
  }
}

TEST(SurplusCopies, ANodeRemovesAnObjectOnlyWhileItHoldsTheCheckedWrite) {
  TempDir dir("kvstream-surplus");
  MemoryBudget budget(64 << 20);
  {
    auto store = ChunkStore::open(dir.path().string(), 1 << 20, budget);
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    ChunkStore& st = **store;
    const ObjectKey a0{"t", "ctx", 0, 0}, a1{"t", "ctx", 1, 0}, b0{"t", "other", 0, 0};
    ASSERT_TRUE(st.put(a0, pattern(1000, 1), 50).ok());
    ASSERT_TRUE(st.put(a1, pattern(300, 2), 60).ok());
    ASSERT_TRUE(st.put(b0, pattern(200, 3), 70).ok());
    const ContextTouch t{"ctx", 1};
    ASSERT_TRUE(st.touch("t", std::span(&t, 1), 999).ok());
    ASSERT_TRUE(st.get(a0).ok());  // cached: the remove must drop it from the cache too
    const auto charge = [&](uint64_t n) { return st.disk_charge(n, 0, false); };
    EXPECT_EQ(st.namespace_bytes("t"), charge(1000) + charge(300) + charge(200) + 2 * st.context_charge());

    // The check saw version 50; a newer write landed since: it stays.
    ASSERT_TRUE(st.put(a0, pattern(1000, 4), 55).ok());
    auto r = st.remove_object(a0, 50);
    EXPECT_EQ(r.status().code(), StatusCode::already_exists);
    EXPECT_EQ(*st.read_all(a0), pattern(1000, 4));
    // The write that was checked (or an older one) goes, and its bytes leave the quota.
    r = st.remove_object(a0, 55);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, 1000u);
    EXPECT_EQ(st.get(a0).status().code(), StatusCode::not_found);
    EXPECT_EQ(st.namespace_bytes("t"), charge(300) + charge(200) + 2 * st.context_charge());
    EXPECT_EQ(st.remove_object(a0, 100).status().code(), StatusCode::not_found);
    auto stats = st.stat("t", "ctx");
    ASSERT_TRUE(stats.ok());
    ASSERT_EQ(stats->size(), 1u);
    EXPECT_EQ((*stats)[0].chunk, 1u);
    EXPECT_EQ((*stats)[0].level_versions, std::vector<uint64_t>{60});
    EXPECT_EQ(st.use_mark("t", "ctx").stamp, 999u) << "the context still holds a chunk: its mark stays";
    // Its last object takes the context, its directory and its use mark.
    ASSERT_TRUE(st.remove_object(a1, 60).ok());
    EXPECT_EQ(st.stat("t", "ctx").status().code(), StatusCode::not_found);
    EXPECT_EQ(st.list("t"), std::vector<std::string>{"other"});
    EXPECT_FALSE(fs::exists(dir.path() / "t" / "ctx"));
    EXPECT_EQ(st.use_mark("t", "ctx").stamp, 0u);
    EXPECT_EQ(st.remove_object({"t", "../x", 0, 0}, 1).status().code(), StatusCode::invalid_argument);
  }
  // A restart finds what was left, and nothing of what went.
  auto store = ChunkStore::open(dir.path().string(), 1 << 20, budget);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->list("t"), std::vector<std::string>{"other"});
  EXPECT_EQ((*store)->namespace_bytes("t"), (*store)->disk_charge(200, 0, false) + (*store)->context_charge());
}

std::vector<ChunkStat> holding(uint32_t chunk, uint64_t version) { return {{chunk, {100}, {}, {version}}}; }

TEST(SurplusCopies, WhatAnOwnerHoldsOfTheWrite) {
  using cluster::owner_holds;
  using cluster::OwnerHolds;
  const auto at_10 = holding(3, 10), at_12 = holding(3, 12), at_8 = holding(3, 8), other_chunk = holding(4, 10);
  const std::vector<ChunkStat> none, old_node = {{3, {100}, {}, {}}}, level_absent = {{3, {0, 100}, {}, {0, 10}}};
  EXPECT_EQ(owner_holds(3, 0, 10, at_10), OwnerHolds::same_or_newer);
  EXPECT_EQ(owner_holds(3, 0, 10, at_12), OwnerHolds::same_or_newer);
  EXPECT_EQ(owner_holds(3, 0, 10, at_8), OwnerHolds::older);
  EXPECT_EQ(owner_holds(3, 0, 10, none), OwnerHolds::none);
  EXPECT_EQ(owner_holds(3, 0, 10, other_chunk), OwnerHolds::none);
  EXPECT_EQ(owner_holds(3, 0, 10, level_absent), OwnerHolds::none);
  EXPECT_EQ(owner_holds(3, 1, 10, level_absent), OwnerHolds::same_or_newer);
  EXPECT_EQ(owner_holds(3, 2, 10, level_absent), OwnerHolds::none) << "a level past the owner's";
  EXPECT_EQ(owner_holds(3, 0, 10, old_node), OwnerHolds::unsaid);
  EXPECT_EQ(owner_holds(3, 0, 0, at_8), OwnerHolds::same_or_newer) << "a copy stored without a version is the oldest";
}

TEST(SurplusCopies, ACopyGoesToTheOwnersThatNeedItUnlessAnOwnerDoesNotSay) {
  using cluster::OwnerHolds;
  using Action = cluster::SurplusPlan::Action;
  const auto plan = [](std::vector<OwnerHolds> holds) { return cluster::plan_surplus(holds); };
  auto p = plan({OwnerHolds::same_or_newer, OwnerHolds::same_or_newer});
  EXPECT_EQ(p.action, Action::drop);
  EXPECT_TRUE(p.to.empty());
  p = plan({OwnerHolds::same_or_newer, OwnerHolds::none});
  EXPECT_EQ(p.action, Action::hand_over);
  EXPECT_EQ(p.to, std::vector<size_t>{1});
  p = plan({OwnerHolds::older, OwnerHolds::same_or_newer, OwnerHolds::none});
  EXPECT_EQ(p.action, Action::hand_over);
  EXPECT_EQ(p.to, (std::vector<size_t>{0, 2}));
  EXPECT_EQ(plan({OwnerHolds::none, OwnerHolds::unsaid}).action, Action::keep) << "the copy may be the newest";
  EXPECT_EQ(plan({OwnerHolds::unsaid, OwnerHolds::same_or_newer}).action, Action::keep);
  EXPECT_EQ(plan({}).action, Action::drop);
}

// The times are the test's: a wait is said once it has lasted the period, then once
// each period (not at each look, 200 ms apart in the rebalancer), and one that ended
// starts afresh.
TEST(SurplusCopies, AFencedNodesWaitIsSaidEachPeriodWhileItLasts) {
  using namespace std::chrono_literals;
  cluster::WaitWarning w(30s);
  const transport::Clock::time_point t0{};
  EXPECT_FALSE(w.waiting(t0)) << "the first look starts the wait";
  EXPECT_FALSE(w.waiting(t0 + 200ms));
  EXPECT_FALSE(w.waiting(t0 + 29s));
  ASSERT_TRUE(w.waiting(t0 + 30s));
  EXPECT_FALSE(w.waiting(t0 + 30200ms)) << "said once a period";
  EXPECT_FALSE(w.waiting(t0 + 59s));
  const auto lasted = w.waiting(t0 + 61s);
  ASSERT_TRUE(lasted);
  EXPECT_EQ(*lasted, 61s) << "how long, from the first look";
  w.ended();
  EXPECT_FALSE(w.waiting(t0 + 100s)) << "a new wait";
  EXPECT_FALSE(w.waiting(t0 + 129s));
  const auto again = w.waiting(t0 + 130s);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, 30s);
}

}  // namespace
}  // namespace kvstream::storage

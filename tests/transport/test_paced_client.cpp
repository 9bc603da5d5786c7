// The paced client (include/kvstream/paced_client.hpp) over a fake inner client that
// completes every get at once: completions are released at the paced times.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "kvstream/paced_client.hpp"

namespace kvstream::storage {
namespace {

using namespace std::chrono_literals;
using transport::CancelToken;
using transport::Clock;
using transport::deadline_in;

// A client written before parts and ranges: only the calls every client must have.
class LegacyClient : public Client {
 public:
  int puts = 0;
  Result<transport::MemoryRegion> register_memory(void*, size_t) override { return transport::MemoryRegion(); }
  Status put(const std::string&, uint32_t, uint32_t, std::span<const std::byte>, transport::Deadline,
             const CancelToken&) override {
    ++puts;
    return {};
  }
  void get_async(const std::string&, uint32_t, uint32_t, transport::MemoryRegion, size_t, size_t, transport::Deadline,
                 const CancelToken&, GetCallback done) override {
    done(size_t(0));
  }
  Result<std::vector<ChunkStat>> stat(const std::string&, transport::Deadline, const CancelToken&) override {
    return std::vector<ChunkStat>{};
  }
  Status remove(const std::string&, transport::Deadline, const CancelToken&) override { return {}; }
  Result<std::vector<std::string>> list(transport::Deadline, const CancelToken&) override {
    return std::vector<std::string>{};
  }
};

// Completes gets immediately with `bytes` (or `error`), from the caller's thread;
// range gets with their length. Records what reached it.
class FakeClient final : public Client {
 public:
  size_t bytes = 1000;
  Status error;
  struct Range {
    uint64_t offset = 0, length = 0;
    size_t dest_offset = 0;
  };
  std::vector<Range>* ranges = nullptr;                  // where range gets are recorded, when set
  std::vector<std::vector<ObjectPart>>* puts = nullptr;  // the parts of each put, when set
  void get_range_async(const std::string&, uint32_t, uint32_t, uint64_t offset, uint64_t length,
                       transport::MemoryRegion, size_t dest_offset, transport::Deadline, const CancelToken&,
                       GetCallback done) override {
    if (ranges) ranges->push_back({offset, length, dest_offset});
    if (!error.ok()) return done(error);
    done(size_t(length));
  }
  Status put_parts(const std::string&, uint32_t, uint32_t, std::span<const std::byte>,
                   std::span<const ObjectPart> parts, uint64_t, transport::Deadline, const CancelToken&) override {
    if (puts) puts->emplace_back(parts.begin(), parts.end());
    return {};
  }
  Result<transport::MemoryRegion> register_memory(void*, size_t) override { return transport::MemoryRegion(); }
  Status put(const std::string&, uint32_t, uint32_t, std::span<const std::byte>, transport::Deadline,
             const CancelToken&) override {
    return {};
  }
  void get_async(const std::string&, uint32_t, uint32_t, transport::MemoryRegion, size_t, size_t,
                 transport::Deadline, const CancelToken&, GetCallback done) override {
    if (!error.ok()) return done(error);
    done(bytes);
  }
  Result<std::vector<ChunkStat>> stat(const std::string&, transport::Deadline, const CancelToken&) override {
    return std::vector<ChunkStat>{{0, {7, 3}, {{}, {{1, 0.5}, {3, 0.25}}}}};
  }
  Status remove(const std::string&, transport::Deadline, const CancelToken&) override { return {}; }
  Result<std::vector<std::string>> list(transport::Deadline, const CancelToken&) override {
    return std::vector<std::string>{"a"};
  }
};

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

TEST(PacedClient, RejectsBadSettings) {
  PacedClientConfig c;
  c.bits_per_second = 0;
  EXPECT_EQ(make_paced_client(std::make_unique<FakeClient>(), c).status().code(), StatusCode::invalid_argument);
  c.bits_per_second = 1e6;
  EXPECT_EQ(make_paced_client(nullptr, c).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(make_paced_client(std::make_unique<FakeClient>(), -1.0), nullptr);
  EXPECT_NE(make_paced_client(std::make_unique<FakeClient>()), nullptr);  // 3 Gbit/s default
}

TEST(PacedClient, ReleasesCompletionsAtTheLinkRate) {
  // 1,000,000 bit/s: a 10,000-byte body takes 80 ms; three issued together end at
  // 80, 160 and 240 ms.
  auto fake = std::make_unique<FakeClient>();
  fake->bytes = 10000;
  auto c = make_paced_client(std::move(fake), 1e6);
  ASSERT_NE(c, nullptr);
  const auto t0 = Clock::now();
  std::vector<std::future<Result<size_t>>> f;
  for (int i = 0; i < 3; ++i) f.push_back(c->get_future("ctx", i, 0, {}, 0, 10000, deadline_in(10s)));
  std::vector<double> ends;
  for (auto& x : f) {
    auto r = x.get();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, 10000u);
    ends.push_back(secs(Clock::now() - t0));
  }
  EXPECT_GE(ends[0], 0.079);
  EXPECT_GE(ends[1], 0.159);
  EXPECT_GE(ends[2], 0.239);
  EXPECT_LT(ends[2], 0.239 + 0.2);  // generous: a loaded CI machine
  // Once the link is idle, a new body starts when requested: 80 ms again.
  std::this_thread::sleep_for(100ms);
  const auto t1 = Clock::now();
  ASSERT_TRUE(c->get("ctx", 0, 0, {}, 0, 10000, deadline_in(10s)).ok());
  EXPECT_GE(secs(Clock::now() - t1), 0.079);
  EXPECT_LT(secs(Clock::now() - t1), 0.079 + 0.2);
}

TEST(PacedClient, BurstPassesAtOnce) {
  auto fake = std::make_unique<FakeClient>();
  fake->bytes = 10000;
  PacedClientConfig pc;
  pc.bits_per_second = 1e6;
  pc.burst_bytes = 10000;
  auto c = make_paced_client(std::move(fake), pc);
  ASSERT_TRUE(c.ok());
  const auto t0 = Clock::now();
  ASSERT_TRUE((*c)->get("ctx", 0, 0, {}, 0, 10000, deadline_in(10s)).ok());
  EXPECT_LT(secs(Clock::now() - t0), 0.05);  // the full bucket covers it
  ASSERT_TRUE((*c)->get("ctx", 0, 0, {}, 0, 10000, deadline_in(10s)).ok());
  EXPECT_GE(secs(Clock::now() - t0), 0.079);  // the bucket is empty now
}

TEST(PacedClient, HeldCompletionsHonourDeadlineAndCancel) {
  auto fake = std::make_unique<FakeClient>();
  fake->bytes = 125000;  // 1 s at 1 Mbit/s
  auto c = make_paced_client(std::move(fake), 1e6);
  auto t0 = Clock::now();
  auto r = c->get("ctx", 0, 0, {}, 0, 125000, deadline_in(50ms));
  EXPECT_EQ(r.status().code(), StatusCode::timed_out);
  EXPECT_LT(secs(Clock::now() - t0), 0.5);
  CancelToken cancel;
  t0 = Clock::now();
  auto f = c->get_future("ctx", 0, 0, {}, 0, 125000, deadline_in(10s), cancel);
  std::this_thread::sleep_for(30ms);
  cancel.cancel();
  EXPECT_EQ(f.get().status().code(), StatusCode::cancelled);
  EXPECT_LT(secs(Clock::now() - t0), 0.5);
}

TEST(PacedClient, ErrorsAndControlCallsPassThrough) {
  auto fake = std::make_unique<FakeClient>();
  fake->error = make_status(StatusCode::not_found, "no such chunk");
  auto c = make_paced_client(std::move(fake), 1.0);  // 1 bit/s: anything paced would hang
  const auto t0 = Clock::now();
  EXPECT_EQ(c->get("ctx", 0, 0, {}, 0, 10, deadline_in(10s)).status().code(), StatusCode::not_found);
  auto st = c->stat("ctx", deadline_in(1s));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*st)[0].level_bytes, (std::vector<uint64_t>{7, 3}));
  EXPECT_TRUE(c->list(deadline_in(1s)).ok());
  EXPECT_TRUE(c->remove("ctx", deadline_in(1s)).ok());
  std::vector<std::byte> body(1000);
  EXPECT_TRUE(c->put("ctx", 0, 0, body, deadline_in(1s)).ok());  // puts are not paced by default
  EXPECT_LT(secs(Clock::now() - t0), 0.5);
}

// Range gets reach the inner client as asked and complete with their length; parts
// tables reach it with the put; stat's parts come back unchanged.
TEST(PacedClient, RangesAndPartsPassThrough) {
  std::vector<FakeClient::Range> ranges;
  std::vector<std::vector<ObjectPart>> puts;
  auto fake = std::make_unique<FakeClient>();
  fake->ranges = &ranges, fake->puts = &puts;
  auto c = make_paced_client(std::move(fake), 1e15);  // nothing is held noticeably
  ASSERT_NE(c, nullptr);
  auto r = c->get_range("ctx", 1, 2, 4096, 777, {}, 33, deadline_in(10s));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, 777u);
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].offset, 4096u);
  EXPECT_EQ(ranges[0].length, 777u);
  EXPECT_EQ(ranges[0].dest_offset, 33u);
  std::vector<std::byte> body(10);
  const std::vector<ObjectPart> parts = {{4, 2.0}, {10, 1.0}};
  EXPECT_TRUE(c->put_parts("ctx", 0, 0, body, parts, 0, deadline_in(10s)).ok());
  ASSERT_EQ(puts.size(), 1u);
  EXPECT_EQ(puts[0], parts);
  auto st = c->stat("ctx", deadline_in(10s));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*st)[0].level_parts, (std::vector<std::vector<ObjectPart>>{{}, {{1, 0.5}, {3, 0.25}}}));
}

// A range is charged its length: at 8 bit/s a 1-byte range is held for a second, so
// a deadline well inside that ends it (held, not passed through); an inner error is
// not held at all.
TEST(PacedClient, RangesArePacedByTheirLength) {
  auto fake = std::make_unique<FakeClient>();
  auto* inner = fake.get();
  auto c = make_paced_client(std::move(fake), 8.0);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->get_range("ctx", 0, 0, 0, 1, {}, 0, deadline_in(20ms)).status().code(), StatusCode::timed_out);
  inner->error = make_status(StatusCode::out_of_range, "past the end");
  EXPECT_EQ(c->get_range("ctx", 0, 0, 100, 1, {}, 0, deadline_in(10s)).status().code(), StatusCode::out_of_range);
}

// The base class's defaults for a client that predates parts and ranges: a put
// without parts is a put; a parts table or a range read is `unsupported`, never
// silently dropped.
TEST(PacedClient, ClientsWithoutPartsOrRangesSaySo) {
  LegacyClient legacy;
  std::vector<std::byte> body(10);
  EXPECT_TRUE(legacy.put_parts("ctx", 0, 0, body, {}, 0, deadline_in(1s)).ok());
  EXPECT_EQ(legacy.puts, 1);
  EXPECT_EQ(legacy.put_parts("ctx", 0, 0, body, std::vector<ObjectPart>{{10, 1.0}}, 0, deadline_in(1s)).code(),
            StatusCode::unsupported);
  EXPECT_EQ(legacy.put_parts("ctx", 0, 0, body, std::vector<ObjectPart>{{11, 1.0}}, 0, deadline_in(1s)).code(),
            StatusCode::invalid_argument);
  EXPECT_EQ(legacy.puts, 1);
  EXPECT_EQ(legacy.get_range("ctx", 0, 0, 0, 1, {}, 0, deadline_in(1s)).status().code(), StatusCode::unsupported);
}

TEST(PacedClient, DestroyingReleasesHeldCompletions) {
  auto fake = std::make_unique<FakeClient>();
  fake->bytes = 125000;  // 1 s at 1 Mbit/s
  auto c = make_paced_client(std::move(fake), 1e6);
  std::promise<Result<size_t>> p;
  auto f = p.get_future();
  c->get_async("ctx", 0, 0, {}, 0, 125000, deadline_in(10s), {}, [&](Result<size_t> r) { p.set_value(r); });
  const auto t0 = Clock::now();
  c.reset();
  ASSERT_EQ(f.wait_for(0s), std::future_status::ready);
  EXPECT_TRUE(f.get().ok());
  EXPECT_LT(secs(Clock::now() - t0), 0.5);
}

}  // namespace
}  // namespace kvstream::storage

// The paced client (include/kvstream/paced_client.hpp) over a fake inner client that
// completes every get at once, on a fake clock: completions are released at the paced
// times, checked by moving the clock to just before and just after each.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "kvstream/paced_client.hpp"
#include "tests/support/fake_clock.hpp"

namespace kvstream::storage::test_paced_client {
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
  // A transport that could land bodies in GPU memory, and the types registered.
  transport::Capabilities caps{.backend = "fake", .provider = "test", .cuda_memory = true};
  std::vector<transport::MemoryType> registered;
  const transport::Capabilities* capabilities() const override { return &caps; }
  Result<transport::MemoryRegion> register_memory(void* data, size_t size, transport::MemoryType type) override {
    (void)data, (void)size;
    registered.push_back(type);
    return transport::MemoryRegion();
  }
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
  Result<transport::MemoryRegion> register_memory(void* data, size_t size) override {
    return register_memory(data, size, transport::MemoryType::host);
  }
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

// A paced client on a fake clock: the link's time moves only when the test moves it,
// so each completion's release time is checked exactly, whatever the machine's load.
struct Paced {
  testing::FakeClock clock;
  FakeClient* inner = nullptr;
  std::unique_ptr<Client> client;

  explicit Paced(double bits_per_second, uint64_t burst_bytes = 0, size_t bytes = 10000, bool pace_puts = false) {
    auto fake = std::make_unique<FakeClient>();
    fake->bytes = bytes;
    inner = fake.get();
    PacedClientConfig pc;
    pc.bits_per_second = bits_per_second;
    pc.burst_bytes = burst_bytes;
    pc.pace_puts = pace_puts;
    pc.now = clock.fn();
    client = std::move(make_paced_client(std::move(fake), pc)).value();
  }
  // Deadlines are on the fake clock too.
  transport::Deadline in(Clock::duration d) const { return clock.now() + d; }
  // Moves the clock to `t` and returns once the timer has looked at it (something
  // must be held): every completion due by `t` has been released by then.
  [[nodiscard]] bool at(Clock::time_point t) {
    clock.set(t);
    return clock.wait_reads(2);
  }
};

template <typename T>
bool ready(std::future<T>& f) {
  return f.wait_for(0s) == std::future_status::ready;
}
// Waits for a completion that is due (the timer releases it on its next look).
template <typename T>
bool arrives(std::future<T>& f) {
  return f.wait_for(testing::kHangGuard) == std::future_status::ready;
}

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
  // 80, 160 and 240 ms: each is held until then and released then.
  Paced p(1e6);
  const auto t0 = p.clock.now();
  std::vector<std::future<Result<size_t>>> f;
  for (int i = 0; i < 3; ++i) f.push_back(p.client->get_future("ctx", i, 0, {}, 0, 10000, p.in(1h)));
  for (int i = 0; i < 3; ++i) {
    const auto end = t0 + (i + 1) * 80ms;
    ASSERT_TRUE(p.at(end - 1us));
    for (int j = i; j < 3; ++j) EXPECT_FALSE(ready(f[j])) << "body " << j << " released before " << i * 80 + 80 << " ms";
    p.clock.set(end + 1us);
    ASSERT_TRUE(arrives(f[i]));
    auto r = f[i].get();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, 10000u);
  }
  // Once the link is idle, a new body starts when requested: 80 ms from then.
  const auto t1 = t0 + 340ms;
  p.clock.set(t1);
  auto g = p.client->get_future("ctx", 0, 0, {}, 0, 10000, p.in(1h));
  ASSERT_TRUE(p.at(t1 + 80ms - 1us));
  EXPECT_FALSE(ready(g));
  p.clock.set(t1 + 80ms + 1us);
  ASSERT_TRUE(arrives(g));
  EXPECT_TRUE(g.get().ok());
}

TEST(PacedClient, BurstPassesAtOnce) {
  Paced p(1e6, 10000);
  const auto t0 = p.clock.now();
  auto first = p.client->get_future("ctx", 0, 0, {}, 0, 10000, p.in(1h));
  EXPECT_TRUE(ready(first)) << "the full bucket covers it: released without the clock moving";
  EXPECT_TRUE(first.get().ok());
  auto second = p.client->get_future("ctx", 0, 0, {}, 0, 10000, p.in(1h));
  ASSERT_TRUE(p.at(t0 + 80ms - 1us));
  EXPECT_FALSE(ready(second)) << "the bucket is empty now";
  p.clock.set(t0 + 80ms + 1us);
  ASSERT_TRUE(arrives(second));
  EXPECT_TRUE(second.get().ok());
}

TEST(PacedClient, HeldCompletionsHonourDeadlineAndCancel) {
  Paced p(1e6, 0, 125000);  // 1 s at 1 Mbit/s
  const auto t0 = p.clock.now();
  auto late = p.client->get_future("ctx", 0, 0, {}, 0, 125000, p.in(50ms));
  ASSERT_TRUE(p.at(t0 + 50ms - 1us));
  EXPECT_FALSE(ready(late));
  p.clock.set(t0 + 50ms);  // the deadline, well before the paced end
  ASSERT_TRUE(arrives(late));
  EXPECT_EQ(late.get().status().code(), StatusCode::timed_out);
  // Cancelled while held: ends without the clock moving at all.
  CancelToken cancel;
  auto f = p.client->get_future("ctx", 0, 0, {}, 0, 125000, p.in(1h), cancel);
  ASSERT_TRUE(p.clock.wait_reads(2));
  EXPECT_FALSE(ready(f));
  cancel.cancel();
  ASSERT_TRUE(arrives(f));
  EXPECT_EQ(f.get().status().code(), StatusCode::cancelled);
}

// pace_puts: a put returns once the uplink would have carried its bytes, and a
// deadline before that ends it.
TEST(PacedClient, PutsArePacedWhenAsked) {
  Paced p(1e6, 0, 10000, /*pace_puts=*/true);
  const auto t0 = p.clock.now();
  const std::vector<std::byte> body(10000);  // 80 ms
  auto put = std::async(std::launch::async, [&] { return p.client->put("ctx", 0, 0, body, t0 + 1h); });
  ASSERT_TRUE(p.clock.wait_reads(2));  // the put has read its start time (t0) and is waiting
  ASSERT_TRUE(p.at(t0 + 80ms - 1us));
  EXPECT_FALSE(ready(put));
  p.clock.set(t0 + 80ms + 1us);
  ASSERT_TRUE(arrives(put));
  EXPECT_TRUE(put.get().ok());
  const auto t1 = p.clock.now();  // the uplink is idle again: 80 ms from now
  auto late = std::async(std::launch::async, [&] { return p.client->put("ctx", 0, 0, body, t1 + 50ms); });
  ASSERT_TRUE(p.clock.wait_reads(2));
  ASSERT_TRUE(p.at(t1 + 50ms - 1us));
  EXPECT_FALSE(ready(late));
  p.clock.set(t1 + 50ms);
  ASSERT_TRUE(arrives(late));
  EXPECT_EQ(late.get().code(), StatusCode::timed_out);
}

TEST(PacedClient, ErrorsAndControlCallsPassThrough) {
  // 1 bit/s on a clock that never moves: anything held would never be released, so
  // each result being there when its call returns shows nothing was paced.
  Paced p(1.0, 0, 10);
  p.inner->error = make_status(StatusCode::not_found, "no such chunk");
  auto got = p.client->get_future("ctx", 0, 0, {}, 0, 10, p.in(1h));
  ASSERT_TRUE(ready(got)) << "an inner error is passed on at once";
  EXPECT_EQ(got.get().status().code(), StatusCode::not_found);
  auto st = p.client->stat("ctx", p.in(1h));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*st)[0].level_bytes, (std::vector<uint64_t>{7, 3}));
  EXPECT_TRUE(p.client->list(p.in(1h)).ok());
  EXPECT_TRUE(p.client->remove("ctx", p.in(1h)).ok());
  std::vector<std::byte> body(1000);
  EXPECT_TRUE(p.client->put("ctx", 0, 0, body, p.in(1h)).ok());  // puts are not paced by default
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
  Paced p(8.0);
  const auto t0 = p.clock.now();
  std::promise<Result<size_t>> held;
  auto f = held.get_future();
  p.client->get_range_async("ctx", 0, 0, 0, 1, {}, 0, p.in(20ms), {}, [&](Result<size_t> r) { held.set_value(r); });
  ASSERT_TRUE(p.at(t0 + 20ms - 1us));
  EXPECT_FALSE(ready(f));
  p.clock.set(t0 + 20ms);
  ASSERT_TRUE(arrives(f));
  EXPECT_EQ(f.get().status().code(), StatusCode::timed_out);
  p.inner->error = make_status(StatusCode::out_of_range, "past the end");
  EXPECT_EQ(p.client->get_range("ctx", 0, 0, 100, 1, {}, 0, p.in(1h)).status().code(), StatusCode::out_of_range);
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

// The pipeline's GPUDirect check reads the capabilities of the client it is given,
// which is often a paced one: the pacer reports its inner client's, and hands device
// registrations to it.
TEST(PacedClient, CapabilitiesAndMemoryTypesAreTheInnerClients) {
  Paced p(1e9);
  const transport::Capabilities* caps = p.client->capabilities();
  ASSERT_EQ(caps, &p.inner->caps);
  EXPECT_TRUE(caps->cuda_memory);
  std::byte buf[64];
  EXPECT_TRUE(p.client->register_memory(buf, sizeof buf, transport::MemoryType::cuda).ok());
  EXPECT_TRUE(p.client->register_memory(buf, sizeof buf).ok());
  EXPECT_EQ(p.inner->registered, (std::vector{transport::MemoryType::cuda, transport::MemoryType::host}));
}

// A client that reports nothing is read as host memory only, and refuses device
// memory by default instead of registering it as host memory.
TEST(PacedClient, ClientsWithoutCapabilitiesTakeHostMemoryOnly) {
  LegacyClient legacy;
  Client& client = legacy;  // it overrides only the host registration, which hides the other
  EXPECT_EQ(client.capabilities(), nullptr);
  std::byte buf[64];
  EXPECT_TRUE(client.register_memory(buf, sizeof buf, transport::MemoryType::host).ok());
  auto cuda = client.register_memory(buf, sizeof buf, transport::MemoryType::cuda);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), StatusCode::unsupported);
  EXPECT_NE(cuda.status().message().find("cuda"), std::string::npos) << cuda.status().to_string();
}

// On a clock that never moves the completion could only be released by the
// destruction itself.
TEST(PacedClient, DestroyingReleasesHeldCompletions) {
  Paced p(1e6, 0, 125000);  // 1 s at 1 Mbit/s
  std::promise<Result<size_t>> held;
  auto f = held.get_future();
  p.client->get_async("ctx", 0, 0, {}, 0, 125000, p.in(1h), {}, [&](Result<size_t> r) { held.set_value(r); });
  ASSERT_TRUE(p.clock.wait_reads(2));
  EXPECT_FALSE(ready(f));
  p.client.reset();
  ASSERT_TRUE(ready(f));
  EXPECT_TRUE(f.get().ok());
}

}  // namespace
}  // namespace kvstream::storage::test_paced_client

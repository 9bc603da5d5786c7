// The fetch scheduler against a real storage node on loopback: admission predicts
// before committing, priorities order the queue, a queued fetch ends at its deadline
// or on cancel without starting, running fetches share the link and deliver the same
// bytes as a serial decode, and every buffer comes back.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <thread>
#include <mutex>

#include "kvstream/scheduler.hpp"
#include "tests/codec/synthetic_kv.hpp"
#include "tests/support/fake_clock.hpp"
#include "tests/support/temp_dir.hpp"

namespace kvstream::test_scheduler {

using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const KvGeometry kGeom{2, 2, 16, 4, AttentionKind::gqa};
const RopeParams kRope{true, 10000.0f, 0, RopePairing::interleaved};
constexpr uint32_t kTokens = 384, kChunk = 64;

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::ServerConfig sc;
    sc.address = "127.0.0.1:0";
    sc.directory = dir_.string();
    sc.secrets = {{"ns", "scheduler-secret-01"}};
    server_ = std::move(storage::Server::start(sc)).value();
    storage::ClientConfig cc;
    cc.address = server_->address();
    cc.name_space = "ns";
    cc.secret = "scheduler-secret-01";
    client_ = std::move(storage::Client::connect(cc, deadline_in(10s))).value();
    auto train = KvCache::create(kGeom, DType::f32, kTokens).value();
    kvstream::test_util::fill_synthetic(train, kRope, 99);
    std::vector<KvView> samples;
    for (const auto& r : codec::chunk_ranges(kTokens, kChunk)) samples.push_back(*train.view().slice(r));
    codec::ProfileOptions opt;
    opt.level_steps = {0.1f, 0.4f, 1.2f};
    profile_ = std::move(codec::ProfileBuilder::build(samples, kRope, opt)).value();
    kv_ = KvCache::create(kGeom, DType::f32, kTokens).value();
    kvstream::test_util::fill_synthetic(kv_, kRope, 7);
    ranges_ = codec::chunk_ranges(kTokens, kChunk);
    for (const char* ctx : {"a", "b", "c"})
      for (uint32_t i = 0; i < ranges_.size(); ++i)
        for (uint32_t L = 0; L < profile_.levels(); ++L) {
          std::vector<uint8_t> bytes;
          ASSERT_TRUE(codec::encode_chunk(profile_, *kv_.view().slice(ranges_[i]), L, bytes).ok());
          ASSERT_TRUE(client_->put(ctx, i, L, std::as_bytes(std::span(bytes)), deadline_in(10s)).ok());
          if (ctx[0] == 'a') stored_[{i, L}] = bytes;
        }
    pipeline::PipelineConfig pc;
    pc.depth = 3;
    pc.max_chunk_bytes = 1 << 20;
    pipeline_ = std::move(pipeline::Pipeline::create(*client_, profile_, pc)).value();
  }
  void TearDown() override {
    pipeline_.reset();
    client_.reset();
    server_.reset();
  }

  // A plan on a link the estimators believe runs at `bits_per_second` until told
  // otherwise; quality losses fall with the level index rising.
  pipeline::AdaptivePlan plan(double bits_per_second) {
    pipeline::AdaptivePlan p;
    p.chooser = std::shared_ptr<const policy::Chooser>(policy::make_chooser("deadline").value());
    policy::EstimatorOptions eo;
    eo.prior_bits_per_second = bits_per_second;
    p.estimators = std::shared_ptr<policy::EstimatorSet>(policy::EstimatorSet::create("ewma", eo).value());
    p.peer = server_->address();
    p.level_quality_loss = {0.2, 1.0, 4.0};
    p.recompute_tokens_per_second = 20000;
    return p;
  }
  pipeline::ScheduledFetch fetch_of(const std::string& ctx, KvCache& out, std::chrono::milliseconds deadline,
                                    int priority = 0) {
    return fetch_at(ctx, out, deadline_in(deadline), priority);
  }
  pipeline::ScheduledFetch fetch_at(const std::string& ctx, KvCache& out, Deadline deadline, int priority = 0) {
    pipeline::ScheduledFetch f;
    f.request.context = ctx;
    f.request.destination = out.view();
    f.request.chunks = ranges_;
    f.request.deadline = deadline;
    f.priority = priority;
    f.chunk_tokens.assign(ranges_.size(), kChunk);
    return f;
  }

  kvstream::testing::TempDir dir_{"kvstream-scheduler"};
  std::unique_ptr<storage::Server> server_;
  std::unique_ptr<storage::Client> client_;
  std::unique_ptr<pipeline::Pipeline> pipeline_;
  codec::Profile profile_;
  KvCache kv_;
  std::vector<TokenRange> ranges_;
  std::map<std::pair<uint32_t, uint32_t>, std::vector<uint8_t>> stored_;
};

// On a fake clock an hour past the real one: the time left is exactly the deadline
// given, and the stat of each admission (on the real clock, same deadline) has an hour.
TEST_F(SchedulerTest, AdmissionPredictsBeforeCommitting) {
  kvstream::testing::FakeClock clock(Clock::now() + 1h);
  pipeline::SchedulerConfig cfg;
  cfg.now = clock.fn();
  auto s = pipeline::Scheduler::create(*pipeline_, *client_, plan(1e9), cfg);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
  auto roomy = (*s)->predict(fetch_at("a", out, clock.now() + 10s));
  ASSERT_TRUE(roomy.ok()) << roomy.status().to_string();
  EXPECT_TRUE(roomy->fits);
  EXPECT_EQ(roomy->plan.size(), ranges_.size());
  EXPECT_EQ(roomy->queue_seconds, 0.0);
  EXPECT_NEAR(roomy->link_bits_per_second, 1e9, 1e8);
  EXPECT_DOUBLE_EQ(roomy->mean_quality_loss, 0.0);  // roomy: everything at the best option
  // A deadline nothing meets (a 100 kbit/s link, text slower than the deadline too):
  // predicted to miss.
  auto slow = pipeline::Scheduler::create(*pipeline_, *client_, plan(1e5), cfg);
  ASSERT_TRUE(slow.ok());
  auto tight = (*slow)->predict(fetch_at("a", out, clock.now() + 5ms));
  ASSERT_TRUE(tight.ok()) << tight.status().to_string();
  EXPECT_FALSE(tight->fits);
  // Unknown context: the stat's error.
  EXPECT_EQ((*s)->predict(fetch_at("nope", out, clock.now() + 10s)).status().code(), StatusCode::not_found);
  EXPECT_EQ((*s)->running(), 0u);
  EXPECT_EQ((*s)->queued(), 0u);
}

TEST_F(SchedulerTest, NoEstimateIsAClearError) {
  auto p = plan(1e9);
  p.estimators = std::shared_ptr<policy::EstimatorSet>(policy::EstimatorSet::create("ewma").value());
  auto s = pipeline::Scheduler::create(*pipeline_, *client_, p);
  ASSERT_TRUE(s.ok());
  auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
  auto a = (*s)->predict(fetch_of("a", out, 10s));
  EXPECT_EQ(a.status().code(), StatusCode::unavailable);
  EXPECT_NE(a.status().message().find("estimate"), std::string::npos) << a.status().to_string();
}

TEST_F(SchedulerTest, FetchesDeliverTheStoredLevels) {
  auto s = pipeline::Scheduler::create(*pipeline_, *client_, plan(1e9));
  ASSERT_TRUE(s.ok());
  auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
  std::atomic<int> chunks{0};
  auto f = fetch_of("a", out, 20s);
  f.chunk_tokens.clear();  // no text option: every chunk comes from the store
  f.on_chunk = [&](const pipeline::ChunkTimings&) { ++chunks; };
  auto t = (*s)->submit(std::move(f));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_TRUE((*t)->wait().ok());
  EXPECT_EQ(chunks.load(), int(ranges_.size()));
  EXPECT_TRUE((*t)->started());
  // Each chunk equals a serial decode of the level it was fetched at.
  auto ref = KvCache::create(kGeom, DType::f16, kTokens).value();
  for (const auto& ct : (*t)->timings()) {
    ASSERT_TRUE(ct.status.ok()) << ct.status.to_string();
    ASSERT_EQ(ct.decision.action, pipeline::ChunkDecision::Action::fetch);
    ASSERT_TRUE(codec::decode_chunk(profile_, stored_[{ct.chunk, ct.decision.level}],
                                    *ref.view().slice(ranges_[ct.chunk]))
                    .ok());
  }
  ASSERT_EQ(out.bytes().size(), ref.bytes().size());
  EXPECT_EQ(0, std::memcmp(out.bytes().data(), ref.bytes().data(), out.bytes().size()));
  EXPECT_EQ(pipeline_->buffers_in_use(), 0u);
}

// On a fake clock: the doomed fetch's deadline passes when the test moves the clock,
// while the first fetch still holds the only slot. The clock starts an hour past the
// real now, so that what runs on the real clock with the same deadlines (the stat of
// each admission, the running fetches) has an hour, a hang guard; a real 1 ms
// deadline used to make the doomed one's admission itself time out now and then.
TEST_F(SchedulerTest, PriorityOrdersTheQueueAndQueuedFetchesEnd) {
  kvstream::testing::FakeClock clock(Clock::now() + 1h);
  pipeline::SchedulerConfig cfg;
  cfg.max_running = 1;
  cfg.now = clock.fn();
  auto s = pipeline::Scheduler::create(*pipeline_, *client_, plan(1e9), cfg);
  ASSERT_TRUE(s.ok());
  KvCache outs[5];
  for (auto& o : outs) o = KvCache::create(kGeom, DType::f16, kTokens).value();
  std::mutex mu;
  std::vector<std::string> started;
  auto tracked = [&](const std::string& ctx, KvCache& out, std::chrono::milliseconds d, int prio) {
    auto f = fetch_at(ctx, out, clock.now() + d, prio);
    const std::string name = fmt::format("{}{}", ctx, prio);
    f.on_chunk = [&, name](const pipeline::ChunkTimings& t) {
      std::lock_guard lk(mu);
      if (t.chunk == 0) started.push_back(name);
    };
    return f;
  };
  // The first fetch holds the only slot until every other one is queued: its first
  // chunk's callback says it runs, then waits for `release`.
  std::promise<void> release, running;
  auto released = release.get_future().share();
  auto f0 = tracked("a", outs[0], 20s, 0);
  f0.on_chunk = [&, released, inner = f0.on_chunk](const pipeline::ChunkTimings& t) {
    inner(t);
    if (t.chunk == 0) {
      running.set_value();
      released.wait();
    }
  };
  auto first = (*s)->submit(std::move(f0));
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(running.get_future().wait_for(kvstream::testing::kHangGuard), std::future_status::ready);
  ASSERT_TRUE((*first)->started());
  auto low = (*s)->submit(tracked("b", outs[1], 20s, 0));
  auto high = (*s)->submit(tracked("c", outs[2], 20s, 5));
  auto doomed = (*s)->submit(tracked("a", outs[3], 1ms, 9));
  auto dropped = (*s)->submit(tracked("b", outs[4], 20s, -1));
  for (auto* t : {&low, &high, &doomed, &dropped}) ASSERT_TRUE(t->ok()) << t->status().to_string();
  (*dropped)->cancel();
  clock.advance(1ms);  // the doomed one's deadline passes while queued (the others' are 20 s away)
  release.set_value();
  EXPECT_TRUE((*first)->wait().ok());
  EXPECT_TRUE((*low)->wait().ok());
  EXPECT_TRUE((*high)->wait().ok());
  const Status d = (*doomed)->wait();
  EXPECT_EQ(d.code(), StatusCode::timed_out) << d.to_string();
  EXPECT_EQ((*dropped)->wait().code(), StatusCode::cancelled);
  EXPECT_FALSE((*dropped)->started());
  EXPECT_FALSE((*doomed)->started());
  // Among those queued behind the first, the higher priority starts first.
  std::lock_guard lk(mu);
  auto pos = [&](const std::string& n) { return std::find(started.begin(), started.end(), n) - started.begin(); };
  ASSERT_LT(pos("c5"), std::ptrdiff_t(started.size()));
  ASSERT_LT(pos("b0"), std::ptrdiff_t(started.size()));
  EXPECT_LT(pos("c5"), pos("b0"));
  EXPECT_EQ(pipeline_->buffers_in_use(), 0u);
}

// On a clock that stands still: the fetches ahead have spent none of their predicted
// time when the third is predicted, however long the machine takes to get there, so
// it must wait all of the shorter one's.
TEST_F(SchedulerTest, FetchesAheadDelayAndShareTheLink) {
  kvstream::testing::FakeClock clock(Clock::now());
  pipeline::SchedulerConfig cfg;
  cfg.max_running = 2;
  cfg.now = clock.fn();
  // A slow link as the estimators see it (the loopback is far faster: the fetches
  // themselves finish quickly; only the predictions are slow).
  auto s = pipeline::Scheduler::create(*pipeline_, *client_, plan(2e6), cfg);
  ASSERT_TRUE(s.ok());
  KvCache outs[3];
  for (auto& o : outs) o = KvCache::create(kGeom, DType::f16, kTokens).value();
  auto alone = (*s)->predict(fetch_of("a", outs[0], 20s));
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(alone->queue_seconds, 0.0);
  // The first two hold their slots (their first chunk's callback waits) until the
  // third is submitted.
  std::promise<void> release;
  auto released = release.get_future().share();
  std::vector<std::shared_ptr<pipeline::Ticket>> tickets;
  for (int i = 0; i < 3; ++i) {
    auto f = fetch_of("a", outs[i], 20s);
    if (i < 2)
      f.on_chunk = [released](const pipeline::ChunkTimings& t) {
        if (t.chunk == 0) released.wait();
      };
    auto t = (*s)->submit(std::move(f));
    ASSERT_TRUE(t.ok());
    tickets.push_back(*t);
  }
  release.set_value();
  // The second shares the link with the first; the third waits for a slot.
  EXPECT_NEAR(tickets[1]->admission().link_bits_per_second, 1e6, 1e5);
  const double first_runs = tickets[0]->admission().predicted_seconds;
  const double second_runs = tickets[1]->admission().predicted_seconds;
  ASSERT_GT(first_runs, 0.0);
  EXPECT_NEAR(tickets[2]->admission().queue_seconds, std::min(first_runs, second_runs), 1e-6);
  EXPECT_GT(tickets[2]->admission().predicted_seconds, tickets[2]->admission().queue_seconds);
  for (auto& t : tickets) EXPECT_TRUE(t->wait().ok());
}

TEST_F(SchedulerTest, CancelRunningFreesBuffersAndDestructionEndsEverything) {
  auto s = pipeline::Scheduler::create(*pipeline_, *client_, plan(1e9));
  ASSERT_TRUE(s.ok());
  KvCache outs[4];
  for (auto& o : outs) o = KvCache::create(kGeom, DType::f16, kTokens).value();
  std::vector<std::shared_ptr<pipeline::Ticket>> tickets;
  for (int i = 0; i < 4; ++i) tickets.push_back((*s)->submit(fetch_of("b", outs[i], 20s)).value());
  tickets[0]->cancel();
  const Status c = tickets[0]->wait();
  EXPECT_TRUE(c.ok() || c.code() == StatusCode::cancelled) << c.to_string();  // it may have finished first
  s->reset();  // cancels the rest; every ticket ends
  for (auto& t : tickets) {
    const Status st = t->wait();
    EXPECT_TRUE(st.ok() || st.code() == StatusCode::cancelled) << st.to_string();
    t->cancel();  // tickets outlive their scheduler: harmless (ASan watches)
  }
  EXPECT_EQ(pipeline_->buffers_in_use(), 0u);
}

}  // namespace

}  // namespace kvstream::test_scheduler

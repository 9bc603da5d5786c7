// The pipeline against a real storage node on loopback: pipelined = serial bit for
// bit, paged = packed, cancel frees every buffer, a failed chunk is reported with its
// index while the rest complete, recompute decisions are reported, memory stays
// within depth buffers. The GPU path is in test_pipeline_gpu.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <numeric>
#include <random>

#include "kvstream/adaptive_fetch.hpp"
#include "kvstream/gpu.hpp"
#include "kvstream/gpu_decoder.hpp"
#include "kvstream/gpu_resources.hpp"
#include "kvstream/paced_client.hpp"
#include "kvstream/pipeline.hpp"
#include "kvstream/scheduler.hpp"
#include "tests/pipeline/pipeline_fixture.hpp"
#include "tests/support/fake_clock.hpp"
#include "tests/transport/redis_server.hpp"

namespace kvstream::test_pipeline {

using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using namespace kvstream::pipeline_test;

namespace {


TEST_F(PipelineTest, PipelinedEqualsSerialBitForBit) {
  pipeline::PipelineConfig pc;
  pc.depth = 3;
  pc.max_chunk_bytes = 1 << 20;
  pc.decode_threads = 2;
  auto p = pipeline::Pipeline::create(*client_, profile_, pc);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
  std::atomic<uint32_t> delivered{0}, max_in_use{0};
  auto cb = by_index();
  cb.on_chunk = [&](const pipeline::ChunkTimings& t) {
    EXPECT_TRUE(t.status.ok()) << t.chunk << ": " << t.status.to_string();
    EXPECT_LE(t.wire_start, t.wire_end);
    EXPECT_LE(t.decode_start, t.decode_end);
    EXPECT_LE(t.decode_end, t.delivered);
    max_in_use = std::max<uint32_t>(max_in_use, (*p)->buffers_in_use());
    ++delivered;
  };
  auto f = (*p)->fetch(request(out.view()), cb);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_TRUE((*f)->wait().ok());
  EXPECT_EQ(delivered.load(), ranges_.size());
  EXPECT_LE(max_in_use.load(), pc.depth);
  EXPECT_EQ((*p)->buffers_in_use(), 0u);
  const KvCache ref = serial();
  ASSERT_EQ(out.bytes().size(), ref.bytes().size());
  EXPECT_EQ(std::memcmp(out.bytes().data(), ref.bytes().data(), ref.bytes().size()), 0);
  for (const auto& t : (*f)->timings()) EXPECT_EQ(t.bytes, expected_bytes_[t.chunk].size());
}

// Part of a stored context (chunks 3 and 1, in that order) into a smaller
// destination: each range gets the stored chunk it names, and a mismatched list is
// refused before anything is fetched.
TEST_F(PipelineTest, StoredChunksMapRangesToAnyStoredChunk) {
  auto p = pipeline::Pipeline::create(*client_, profile_, {3, 1 << 20, 1});
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  auto out = KvCache::create(kGeom, DType::f16, 2 * kChunk).value();
  pipeline::FetchRequest r;
  r.context = "ctx";
  r.destination = out.view();
  r.chunks = {{0, kChunk}, {kChunk, 2 * kChunk}};
  r.stored_chunks = {3, 1};
  r.deadline = deadline_in(20s);
  pipeline::FetchCallbacks cb;
  cb.decide = [&](uint32_t i, std::span<const uint64_t>) {
    return pipeline::ChunkDecision{pipeline::ChunkDecision::Action::fetch, level_of(r.stored_chunks[i])};
  };
  auto f = (*p)->fetch(r, cb);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_TRUE((*f)->wait().ok());
  auto ref = KvCache::create(kGeom, DType::f16, 2 * kChunk).value();
  ASSERT_TRUE(codec::decode_chunk(profile_, expected_bytes_[3], *ref.view().slice(r.chunks[0])).ok());
  ASSERT_TRUE(codec::decode_chunk(profile_, expected_bytes_[1], *ref.view().slice(r.chunks[1])).ok());
  EXPECT_EQ(std::memcmp(out.bytes().data(), ref.bytes().data(), ref.bytes().size()), 0);
  r.stored_chunks = {3};
  EXPECT_EQ((*p)->fetch(r, cb).status().code(), StatusCode::invalid_argument);
}

TEST_F(PipelineTest, PagedDeliveryMatchesContiguous) {
  auto p = pipeline::Pipeline::create(*client_, profile_, {2, 1 << 20, 1});
  ASSERT_TRUE(p.ok());
  const uint32_t block = 16, blocks = (kTokens + block - 1) / block + 3;
  const int64_t C = kGeom.channels();
  std::vector<std::vector<uint16_t>> mem(kGeom.layers, std::vector<uint16_t>(2 * blocks * block * C));
  PagedLayout pl;
  for (auto& m : mem) pl.layer_base.push_back(m.data());
  pl.block_size = block;
  pl.plane_stride = int64_t(blocks) * block * C;
  pl.block_stride = int64_t(block) * C;
  pl.slot_stride = C;
  pl.num_blocks = blocks;
  std::vector<uint32_t> perm(blocks);
  std::iota(perm.begin(), perm.end(), 0u);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(5));  // scattered, distinct blocks
  pl.block_table.assign(perm.begin(), perm.begin() + (blocks - 3));
  auto paged = KvView::paged(pl, DType::f16, kGeom, kTokens);
  ASSERT_TRUE(paged.ok()) << paged.status().to_string();
  auto f = (*p)->fetch(request(*paged), by_index());
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->wait().ok());
  auto gathered = KvCache::create(kGeom, DType::f16, kTokens).value();
  ASSERT_TRUE(copy_kv(*paged, gathered.view()).ok());
  const KvCache ref = serial();
  EXPECT_EQ(std::memcmp(gathered.bytes().data(), ref.bytes().data(), ref.bytes().size()), 0);
}

TEST_F(PipelineTest, CancelFreesEveryBuffer) {
  auto p = pipeline::Pipeline::create(*client_, profile_, {2, 1 << 20, 1});
  ASSERT_TRUE(p.ok());
  auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
  auto cb = by_index();
  std::atomic<int> seen{0};
  pipeline::FetchRequest req = request(out.view());
  cb.on_chunk = [&, cancel = req.cancel](const pipeline::ChunkTimings&) {
    if (++seen == 1) cancel.cancel();  // cancel once the first chunk is in
  };
  auto f = (*p)->fetch(req, cb);
  ASSERT_TRUE(f.ok());
  const Status st = (*f)->wait();
  EXPECT_EQ((*p)->buffers_in_use(), 0u);
  int cancelled = 0;
  for (const auto& t : (*f)->timings()) cancelled += t.status.code() == StatusCode::cancelled;
  EXPECT_EQ(seen.load(), int(ranges_.size()));  // every chunk is reported, delivered or not
  if (cancelled > 0) EXPECT_EQ(st.code(), StatusCode::cancelled);
  // The pipeline is usable afterwards.
  auto again = (*p)->fetch(request(out.view()), by_index());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->wait().ok());
}

TEST_F(PipelineTest, AFailedChunkIsReportedWhileTheRestComplete) {
  // Corrupt chunk 2's stored level on disk.
  const fs::path obj = dir_ / "ns" / "ctx" / fmt::format("c2.l{}", level_of(2));
  {
    std::fstream f(obj, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x33');
  }
  // A fresh node so the cache does not hold the good copy.
  storage::ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.directory = dir_.string();
  sc.secrets = {{"ns", "pipeline-secret-0123"}};
  client_.reset();
  server_.reset();
  server_ = std::move(storage::Server::start(sc)).value();
  storage::ClientConfig cc{server_->address(), {}, "ns", "pipeline-secret-0123", 1};
  client_ = std::move(storage::Client::connect(cc, deadline_in(10s))).value();
  auto p = pipeline::Pipeline::create(*client_, profile_, {2, 1 << 20, 1});
  ASSERT_TRUE(p.ok());
  auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
  auto f = (*p)->fetch(request(out.view()), by_index());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->wait().code(), StatusCode::corrupt_data);
  const auto t = (*f)->timings();
  for (uint32_t i = 0; i < t.size(); ++i) {
    if (i == 2) {
      EXPECT_EQ(t[i].status.code(), StatusCode::corrupt_data) << t[i].status.to_string();
      EXPECT_NE(t[i].status.message().find("chunk 2"), std::string::npos) << t[i].status.to_string();
    } else {
      EXPECT_TRUE(t[i].status.ok()) << i << ": " << t[i].status.to_string();
    }
  }
  EXPECT_EQ((*p)->buffers_in_use(), 0u);
}

TEST_F(PipelineTest, RecomputeDecisionsAreReportedNotFetched) {
  auto p = pipeline::Pipeline::create(*client_, profile_, {2, 1 << 20, 1});
  ASSERT_TRUE(p.ok());
  auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
  pipeline::FetchCallbacks cb;
  cb.decide = [](uint32_t i, std::span<const uint64_t>) {
    return i == 1 ? pipeline::ChunkDecision{pipeline::ChunkDecision::Action::recompute, 0}
                  : pipeline::ChunkDecision{pipeline::ChunkDecision::Action::fetch, 3};
  };
  auto f = (*p)->fetch(request(out.view()), cb);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->wait().ok());
  const auto t = (*f)->timings();
  EXPECT_EQ(t[1].decision.action, pipeline::ChunkDecision::Action::recompute);
  EXPECT_EQ(t[1].bytes, 0u);
  EXPECT_GT(t[0].bytes, 0u);
}

// A fetch ends with its last chunk's callback; a chunk decided as text passes its
// receive buffer on to the next one, and the last must give it back before that
// callback, or a caller that checks buffers_in_use() once wait() returns sees one
// still lent (the scheduler's test saw it under load).
TEST_F(PipelineTest, AFetchEndingOnTextHoldsNoBufferWhenItEnds) {
  auto p = pipeline::Pipeline::create(*client_, profile_, {2, 1 << 20, 1});
  ASSERT_TRUE(p.ok());
  auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
  const auto req = request(out.view());
  const uint32_t last = uint32_t(req.chunks.size() - 1);
  std::atomic<uint32_t> lent_at_last{99};
  pipeline::FetchCallbacks cb;
  cb.decide = [](uint32_t, std::span<const uint64_t>) {
    return pipeline::ChunkDecision{pipeline::ChunkDecision::Action::recompute, 0};
  };
  cb.on_chunk = [&](const pipeline::ChunkTimings& t) {
    if (t.chunk == last) lent_at_last = (*p)->buffers_in_use();
  };
  auto f = (*p)->fetch(req, cb);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->wait().ok());
  EXPECT_EQ(lent_at_last.load(), 0u);
  EXPECT_EQ((*p)->buffers_in_use(), 0u);
}

TEST_F(PipelineTest, BadRequestsAreRefused) {
  auto p = pipeline::Pipeline::create(*client_, profile_, {2, 1 << 20, 1});
  ASSERT_TRUE(p.ok());
  auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
  auto req = request(out.view());
  req.chunks.push_back({kTokens - 10, kTokens + 5});
  EXPECT_EQ((*p)->fetch(req, by_index()).status().code(), StatusCode::invalid_argument);
  req = request(out.view());
  req.context = "nothing-here";
  EXPECT_EQ((*p)->fetch(req, by_index()).status().code(), StatusCode::not_found);
  EXPECT_FALSE(pipeline::Pipeline::create(*client_, profile_, {0, 1 << 20, 1}).ok());
}

}  // namespace

namespace {

std::vector<std::vector<uint64_t>> stored_sizes(storage::Client& c) {
  std::vector<std::vector<uint64_t>> sizes;
  for (auto& s : c.stat("ctx", deadline_in(10s)).value()) sizes.push_back(s.level_bytes);
  return sizes;
}

// A chooser that records the sizes it was given for each chunk it decides, and picks
// the finest level.
class RecordingChooser final : public policy::Chooser {
 public:
  mutable std::mutex mu;
  mutable std::map<uint32_t, std::vector<uint64_t>> seen;
  Result<policy::Choice> choose(const policy::ContextCosts& costs, const policy::ChooseState& st,
                                const policy::Estimator&) const override {
    std::lock_guard lk(mu);
    seen[st.chunk] = costs.level_bytes.at(st.chunk);
    policy::Choice c;
    c.level = 0;
    return c;
  }
  std::string_view name() const noexcept override { return "recording"; }
};

// The sizes the chooser plans with are those of the chunk fetched for each range, even
// when the table given to adaptive_callbacks was indexed by stored chunk (what callers
// did before range_level_bytes) and through the scheduler, which used to assume
// stats[i].chunk == i.
TEST_F(PipelineTest, AdaptiveDecisionsSeeTheSizesOfTheStoredChunkOfEachRange) {
  auto p = pipeline::Pipeline::create(*client_, profile_, {3, 1 << 20, 1});
  ASSERT_TRUE(p.ok());
  auto out = KvCache::create(kGeom, DType::f16, 5 * kChunk).value();
  pipeline::FetchRequest r;
  r.context = "ctx";
  r.destination = out.view();
  for (uint32_t i = 0; i < 5; ++i) r.chunks.push_back({i * kChunk, (i + 1) * kChunk});
  r.stored_chunks = {4, 3, 2, 1, 0};
  r.deadline = deadline_in(20s);
  auto want = [&](uint32_t i) {
    std::vector<uint64_t> v;
    for (uint32_t L = 0; L < profile_.levels(); ++L) v.push_back(stored_bytes_[{r.stored_chunks[i], L}].size());
    return v;
  };
  ASSERT_NE(want(0), want(4));  // the chunks' sizes differ, so a mix-up shows
  auto ranged = pipeline::range_level_bytes(*client_, r);
  ASSERT_TRUE(ranged.ok());
  for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ((*ranged)[i], want(i)) << "range " << i;

  pipeline::AdaptivePlan plan;
  auto chooser = std::make_shared<RecordingChooser>();
  plan.chooser = chooser;
  policy::EstimatorOptions eo;
  eo.prior_bits_per_second = 1e9;
  plan.estimators = std::shared_ptr<policy::EstimatorSet>(std::move(policy::EstimatorSet::create("ewma", eo)).value());
  plan.peer = server_->address();
  plan.level_quality_loss = {0.1, 0.5, 2.0, 5.0};
  auto by_stored_chunk = stored_sizes(*client_);
  by_stored_chunk.resize(5);
  auto cb = pipeline::adaptive_callbacks(plan, by_stored_chunk, r.deadline);
  ASSERT_TRUE(cb.ok());
  auto f = (*p)->fetch(r, *cb);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->wait().ok());
  for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ(chooser->seen.at(i), want(i)) << "range " << i;

  chooser->seen.clear();
  auto sched = pipeline::Scheduler::create(**p, *client_, plan);
  ASSERT_TRUE(sched.ok());
  pipeline::ScheduledFetch sf;
  sf.request = r;
  auto t = (*sched)->submit(sf);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_TRUE((*t)->wait().ok());
  for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ(chooser->seen.at(i), want(i)) << "range " << i;
}

TEST_F(PipelineTest, AdaptiveFetchChoosesLevelsAndLearnsThePeer) {
  auto p = pipeline::Pipeline::create(*client_, profile_, {3, 1 << 20, 1});
  ASSERT_TRUE(p.ok());
  policy::EstimatorOptions eo;
  eo.prior_bits_per_second = 1e9;
  auto est = policy::EstimatorSet::create("ewma", eo);
  ASSERT_TRUE(est.ok()) << est.status().to_string();
  pipeline::AdaptivePlan plan;
  plan.chooser = std::move(policy::make_chooser("deadline")).value();
  plan.estimators = std::shared_ptr<policy::EstimatorSet>(std::move(est).value());
  plan.peer = server_->address();
  plan.level_quality_loss = {0.1, 0.5, 2.0, 5.0};
  // A generous deadline: every chunk fits at the best level.
  auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
  auto req = request(out.view());
  auto cb = pipeline::adaptive_callbacks(plan, stored_sizes(*client_), req.deadline);
  ASSERT_TRUE(cb.ok()) << cb.status().to_string();
  auto f = (*p)->fetch(req, *cb);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->wait().ok());
  for (const auto& t : (*f)->timings()) {
    EXPECT_EQ(t.decision.action, pipeline::ChunkDecision::Action::fetch);
    EXPECT_EQ(t.decision.level, 0u) << "chunk " << t.chunk;
  }
  // The transfers taught the estimator about this peer.
  uint64_t seen = 0;
  ASSERT_TRUE(plan.estimators->with(plan.peer, [&](policy::Estimator& e) { seen = e.observations(); }).ok());
  EXPECT_EQ(seen, ranges_.size());
  // A deadline already past: the chooser falls back to the smallest level, and the
  // fetch still completes only if time allows (here it has already passed: timed_out).
  auto late = request(out.view());
  late.deadline = deadline_in(-1ms);
  auto cb2 = pipeline::adaptive_callbacks(plan, stored_sizes(*client_), late.deadline);
  ASSERT_TRUE(cb2.ok());
  auto f2 = (*p)->fetch(late, *cb2);
  if (f2.ok()) EXPECT_EQ((*f2)->wait().code(), StatusCode::timed_out);
  EXPECT_EQ((*p)->buffers_in_use(), 0u);
  // An inconsistent plan is refused.
  plan.level_quality_loss = {0.1};
  EXPECT_FALSE(pipeline::adaptive_callbacks(plan, stored_sizes(*client_), req.deadline).ok());
}

// The plan of a fetch asked for its first token soonest ("deadline" chooser, a deadline
// already due, text allowed) recomputes a text prefix while the suffix is fetched:
// here the oracle's link makes a chunk's smallest level as slow as recomputing it (1 s
// each, predicted), so the soonest plan splits the context. The fetched chunks must be
// exactly what decoding each one's stored level alone gives, and the recomputed ones
// reported (decision recompute, nothing fetched) with their destination untouched.
// The plan decides on a clock that stands still at the deadline, so the split does not
// depend on how fast this machine gets to each decision.
TEST_F(PipelineTest, AdaptiveTextPrefixDeliversTheSuffixAsASerialFetch) {
  auto p = pipeline::Pipeline::create(*client_, profile_, {3, 1 << 20, 2});
  ASSERT_TRUE(p.ok());
  const auto sizes = stored_sizes(*client_);
  const uint64_t smallest = *std::min_element(sizes[0].begin(), sizes[0].end());
  policy::EstimatorOptions eo;
  eo.trace = std::make_shared<const policy::LinkTrace>(policy::LinkTrace{{{0, 8.0 * double(smallest)}}, 0});
  pipeline::AdaptivePlan plan;
  plan.chooser = std::move(policy::make_chooser("deadline", {.late_completes_context = true})).value();
  plan.estimators = std::shared_ptr<policy::EstimatorSet>(std::move(policy::EstimatorSet::create("oracle", eo)).value());
  plan.peer = server_->address();
  plan.level_quality_loss = {0.1, 0.5, 2.0, 5.0};
  for (const auto& r : ranges_) plan.chunk_tokens.push_back(r.size());
  plan.recompute_tokens_per_second = kChunk;  // 1 s per full chunk
  // Frozen at the real now: the landings the pipeline reports (real times) stay close
  // to the plan's own.
  kvstream::testing::FakeClock clock(Clock::now());
  plan.now = clock.fn();
  auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
  constexpr std::byte kUntouched{0x5a};
  std::memset(out.bytes().data(), int(kUntouched), out.bytes().size());
  std::atomic<uint32_t> reported_text{0};
  auto req = request(out.view());
  auto cb = pipeline::adaptive_callbacks(plan, sizes, clock.now(), [&](const pipeline::ChunkTimings& t) {
    if (t.decision.action == pipeline::ChunkDecision::Action::recompute) ++reported_text;
  });
  ASSERT_TRUE(cb.ok()) << cb.status().to_string();
  auto f = (*p)->fetch(req, *cb);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->wait().ok());
  const auto timings = (*f)->timings();
  uint32_t text = 0;
  while (text < timings.size() && timings[text].decision.action == pipeline::ChunkDecision::Action::recompute) ++text;
  ASSERT_GE(text, 1u) << "the plan recomputes a text prefix";
  ASSERT_LT(text, timings.size()) << "and fetches the rest";
  EXPECT_EQ(reported_text.load(), text);
  // Row by row: a chunk's slice of the packed cache is not one span.
  const size_t row_bytes = kGeom.channels() * 2;
  auto rows_match = [&](const KvView& v, const std::function<bool(uint32_t, uint32_t, uint64_t)>& ok) {
    for (uint32_t l = 0; l < kGeom.layers; ++l)
      for (uint32_t pl = 0; pl < 2; ++pl)
        for (uint64_t tok = 0; tok < v.tokens(); ++tok)
          if (!ok(l, pl, tok)) return false;
    return true;
  };
  auto ref = KvCache::create(kGeom, DType::f16, kTokens).value();
  for (const auto& t : timings) {
    const KvView got = *out.view().slice(ranges_[t.chunk]);
    if (t.decision.action == pipeline::ChunkDecision::Action::recompute) {
      EXPECT_LT(t.chunk, text) << "text only as the prefix: a later text chunk would wait for the fetched KV";
      EXPECT_EQ(t.bytes, 0u);
      EXPECT_TRUE(rows_match(got, [&](uint32_t l, uint32_t pl, uint64_t tok) {
        const std::byte* r = got.row(l, pl, tok);
        return std::all_of(r, r + row_bytes, [&](std::byte b) { return b == kUntouched; });
      })) << "chunk " << t.chunk << " is the runtime's to recompute";
      continue;
    }
    ASSERT_TRUE(t.status.ok()) << t.chunk << ": " << t.status.to_string();
    const auto& stored = stored_bytes_.at({t.chunk, t.decision.level});
    EXPECT_EQ(t.bytes, stored.size());
    const KvView want = *ref.view().slice(ranges_[t.chunk]);
    ASSERT_TRUE(codec::decode_chunk(profile_, stored, want).ok());
    EXPECT_TRUE(rows_match(got, [&](uint32_t l, uint32_t pl, uint64_t tok) {
      return std::memcmp(got.row(l, pl, tok), want.row(l, pl, tok), row_bytes) == 0;
    })) << "chunk " << t.chunk << " level " << t.decision.level;
  }
  EXPECT_EQ((*p)->buffers_in_use(), 0u);
}

}  // namespace


// The same adaptive-free fetch through the Redis storage client: every chunk decodes
// to the same bytes as through the native node (the pipeline only sees storage::Client).
namespace {
TEST_F(PipelineTest, FetchThroughRedisEqualsTheNativeNode) {
  if (auto why = transport::test_util::RedisServer::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  transport::test_util::RedisServer redis("kvstream-pipeline-redis");
  ASSERT_TRUE(redis.started()) << "redis-server did not start; see " << (redis.dir() / "redis.log");
  auto rc = redis.client();
  ASSERT_TRUE(rc.ok()) << rc.status().to_string();
  for (uint32_t i = 0; i < ranges_.size(); ++i)
    for (uint32_t L = 0; L < profile_.levels(); ++L) {
      std::vector<uint8_t> bytes;
      ASSERT_TRUE(codec::encode_chunk(profile_, *kv_.view().slice(ranges_[i]), L, bytes).ok());
      ASSERT_TRUE((*rc)->put("ctx", i, L, std::as_bytes(std::span(bytes)), deadline_in(10s)).ok());
    }
  auto fetch_with = [&](storage::Client& c) {
    auto p = pipeline::Pipeline::create(c, profile_, {3, 1 << 20, 2});
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
    auto f = (*p)->fetch(request(out.view()), by_index());
    EXPECT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_TRUE((*f)->wait().ok());
    return out;
  };
  const KvCache via_redis = fetch_with(**rc), native = fetch_with(*client_);
  ASSERT_EQ(via_redis.bytes().size(), native.bytes().size());
  EXPECT_EQ(std::memcmp(via_redis.bytes().data(), native.bytes().data(), native.bytes().size()), 0);
}
}  // namespace

}  // namespace kvstream::test_pipeline

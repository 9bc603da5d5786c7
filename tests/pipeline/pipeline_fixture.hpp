// The pipeline tests' fixture: a storage node on loopback holding every level of
// every chunk of a synthetic context (3 layers, GQA, RoPE), a profile trained on other
// data, and the request and callbacks most tests start from. Shared by
// test_pipeline.cpp and test_pipeline_gpu.cpp.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>

#include "kvstream/codec.hpp"
#include "kvstream/pipeline.hpp"
#include "kvstream/storage.hpp"
#include "tests/support/temp_dir.hpp"

namespace kvstream::pipeline_test {

using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

inline const KvGeometry kGeom{3, 2, 16, 4, AttentionKind::gqa};
inline const RopeParams kRope{true, 10000.0f, 0, RopePairing::interleaved};
constexpr uint32_t kTokens = 500, kChunk = 96;

// Correlated channels with offsets, K rotated by RoPE like a runtime's cache.
inline KvCache synthetic_kv(uint32_t seed) {
  auto kv = KvCache::create(kGeom, DType::f32, kTokens).value();
  kv.set_rope(kRope);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01;
  const uint32_t C = kGeom.channels();
  std::vector<float> row(C);
  for (uint32_t l = 0; l < kGeom.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t t = 0; t < kTokens; ++t) {
        const float common = n01(rng);
        for (uint32_t c = 0; c < C; ++c) row[c] = 0.3f * float(c % 5) + common * 0.5f + n01(rng) * (0.2f + 0.05f * c);
        if (p == 0)
          for (uint32_t h = 0; h < kGeom.kv_heads; ++h) rope_rotate(&row[h * kGeom.head_dim], kGeom.head_dim, t, kRope, false);
        kv.view().store_row(l, p, t, row.data());
      }
  return kv;
}

class PipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::ServerConfig sc;
    sc.address = "127.0.0.1:0";
    sc.directory = dir_.string();
    sc.secrets = {{"ns", "pipeline-secret-0123"}};
    server_ = std::move(storage::Server::start(sc)).value();
    storage::ClientConfig cc;
    cc.address = server_->address();
    cc.name_space = "ns";
    cc.secret = "pipeline-secret-0123";
    cc.connections = 2;
    client_ = std::move(storage::Client::connect(cc, deadline_in(10s))).value();
    // Profile from other data than the context.
    train_ = synthetic_kv(99);
    std::vector<KvView> samples;
    for (const auto& r : codec::chunk_ranges(kTokens, kChunk)) samples.push_back(*train_.view().slice(r));
    codec::ProfileOptions opt;
    opt.level_steps = {0.1f, 0.3f, 0.8f, 1.6f};
    profile_ = std::move(codec::ProfileBuilder::build(samples, kRope, opt)).value();
    // Store every level of every chunk of the context.
    kv_ = synthetic_kv(7);
    ranges_ = codec::chunk_ranges(kTokens, kChunk);
    for (uint32_t i = 0; i < ranges_.size(); ++i)
      for (uint32_t L = 0; L < profile_.levels(); ++L) {
        std::vector<uint8_t> bytes;
        ASSERT_TRUE(codec::encode_chunk(profile_, *kv_.view().slice(ranges_[i]), L, bytes).ok());
        ASSERT_TRUE(client_->put("ctx", i, L, std::as_bytes(std::span(bytes)), deadline_in(10s)).ok());
        if (L == level_of(i)) expected_bytes_.push_back(bytes);
        stored_bytes_[{i, L}] = std::move(bytes);
      }
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }
  static uint32_t level_of(uint32_t i) { return i % 4; }

  // The serial reference: each chunk decoded on its own into an f16 cache.
  KvCache serial() {
    auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
    for (uint32_t i = 0; i < ranges_.size(); ++i)
      EXPECT_TRUE(codec::decode_chunk(profile_, expected_bytes_[i], *out.view().slice(ranges_[i])).ok());
    return out;
  }
  pipeline::FetchRequest request(const KvView& dest) {
    pipeline::FetchRequest r;
    r.context = "ctx";
    r.destination = dest;
    r.chunks = ranges_;
    r.deadline = deadline_in(20s);
    return r;
  }
  pipeline::FetchCallbacks by_index() {
    pipeline::FetchCallbacks cb;
    cb.decide = [](uint32_t i, std::span<const uint64_t> sizes) {
      EXPECT_EQ(sizes.size(), 4u);
      return pipeline::ChunkDecision{pipeline::ChunkDecision::Action::fetch, level_of(i)};
    };
    return cb;
  }

  kvstream::testing::TempDir dir_{"kvstream-pipeline"};
  std::unique_ptr<storage::Server> server_;
  std::unique_ptr<storage::Client> client_;
  KvCache train_, kv_;
  codec::Profile profile_;
  std::vector<TokenRange> ranges_;
  std::vector<std::vector<uint8_t>> expected_bytes_;
  std::map<std::pair<uint32_t, uint32_t>, std::vector<uint8_t>> stored_bytes_;  // (chunk, level) as stored
};

}  // namespace kvstream::pipeline_test

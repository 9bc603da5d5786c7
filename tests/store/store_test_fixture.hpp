// The fixture of the KvStore tests: a real storage node on loopback in a directory of
// its own, a synthetic three-layer KV of 500 tokens with a profile trained on another
// seed, and what each chunk decodes to on its own (what any fetch must give).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "kvstream/kvstream.hpp"
#include "tests/codec/synthetic_kv.hpp"
#include "tests/support/temp_dir.hpp"

namespace kvstream::store_test {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

inline const KvGeometry kGeom{3, 2, 16, 4, AttentionKind::gqa};
inline const RopeParams kRope{true, 10000.0f, 0, RopePairing::interleaved};
constexpr uint32_t kTokens = 500, kChunk = 96;
constexpr const char* kSecret = "store-secret-0123456";

inline KvCache synthetic_kv(uint64_t seed) {
  auto kv = KvCache::create(kGeom, DType::f32, kTokens).value();
  kv.set_rope(kRope);
  test_util::fill_synthetic(kv, kRope, seed);
  return kv;
}

inline std::vector<Token> tokens_from(uint32_t seed, uint32_t n = kTokens) {
  std::vector<Token> t(n);
  std::mt19937 rng(seed);
  for (auto& x : t) x = Token(rng() % 512);
  return t;
}

inline transport::Deadline soon() { return transport::deadline_in(20s); }

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::ServerConfig sc;
    sc.address = "127.0.0.1:0";
    sc.directory = (dir_ / "node").string();
    sc.secrets = {{"ns", kSecret}};
    server_ = std::move(storage::Server::start(sc)).value();
    profile_path_ = (dir_ / "p.kvsprofile").string();
    profile_ = make_profile(99, {0.1f, 0.3f, 0.8f, 1.6f});
    ASSERT_TRUE(profile_.save_file(profile_path_).ok());
    kv_ = synthetic_kv(7);
  }
  void TearDown() override { server_.reset(); }
  // The bytes the tenant holds on the node as its quota counts them (each object's file
  // in whole allocation units: more than the payload bytes a usage listing gives).
  uint64_t quota_bytes_used() const {
    for (const auto& u : server_->namespace_usage())
      if (u.name_space == "ns") return u.stored_bytes;
    return 0;
  }
  static codec::Profile make_profile(uint32_t seed, std::vector<float> steps) {
    auto train = synthetic_kv(seed);
    std::vector<KvView> samples;
    for (const auto& r : codec::chunk_ranges(kTokens, kChunk)) samples.push_back(*train.view().slice(r));
    codec::ProfileOptions opt;
    opt.level_steps = std::move(steps);
    return std::move(codec::ProfileBuilder::build(samples, kRope, opt)).value();
  }
  StoreConfig config(std::string model = "synthetic-3l") const {
    StoreConfig c;
    c.storage.address = server_->address();
    c.storage.name_space = "ns";
    c.storage.secret = kSecret;
    c.codec.profile_path = profile_path_;
    c.codec.model_id = std::move(model);
    c.codec.chunk_tokens = kChunk;
    return c;
  }
  KvStore open(const StoreConfig& c) {
    auto s = KvStore::open(c);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return std::move(s).value();
  }
  // A three-level progressive profile (level 2 the base, 0 the finest) in place of
  // the default one.
  void use_progressive_profile() {
    auto train = synthetic_kv(99);
    std::vector<KvView> samples;
    for (const auto& r : codec::chunk_ranges(kTokens, kChunk)) samples.push_back(*train.view().slice(r));
    codec::ProfileOptions opt;
    opt.progressive = true;
    opt.progressive_layers = 3;
    profile_ = std::move(codec::ProfileBuilder::build(samples, kRope, opt)).value();
    ASSERT_TRUE(profile_.save_file(profile_path_).ok());
  }
  // Chunk i of kv_ decoded on its own at `level` into f16: what any fetch must give.
  KvCache reference(uint32_t chunks, uint32_t level) {
    auto out = KvCache::create(kGeom, DType::f16, chunks * kChunk).value();
    for (uint32_t i = 0; i < chunks; ++i) {
      const TokenRange r{i * kChunk, (i + 1) * kChunk};
      std::vector<uint8_t> bytes;
      // As put codes a stored context's chunks: its last tokens are recent.
      const codec::EncodeOptions eo{codec::recent_tokens_of(profile_, r, uint64_t(chunks) * kChunk)};
      EXPECT_TRUE(codec::encode_chunk(profile_, *kv_.view().slice(r), level, eo, bytes).ok());
      EXPECT_TRUE(codec::decode_chunk(profile_, bytes, *out.view().slice(r)).ok());
    }
    return out;
  }

  kvstream::testing::TempDir dir_{"kvstream-store"};
  std::unique_ptr<storage::Server> server_;
  std::string profile_path_;
  codec::Profile profile_;
  KvCache kv_;
};

}  // namespace kvstream::store_test

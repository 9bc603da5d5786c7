// Eviction by use: the store marks a prompt's chunks used when it stores or fetches
// them (one stamp, each chunk its depth), and evict() and eviction.when_full remove the
// least recently used prompts first, whole, reading one usage listing instead of a stat
// and a record per chunk. Chunks nobody marked (a storage from before marks) go first.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "kvstream/kvstream.hpp"
#include "tests/store/store_test_fixture.hpp"

namespace kvstream::store_test {
namespace {

// Fetches the stored prefix of `tokens` at level 1 and waits; the handle is gone on
// return, so the mark that went beside the fetch has landed.
void fetch_all(KvStore& store, const std::vector<Token>& tokens) {
  auto dest = KvCache::create(kGeom, DType::f16, kTokens).value();
  FetchOptions o;
  o.level = 1;
  auto f = store.fetch(tokens, {.host = dest.view()}, soon(), o);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_TRUE(f->wait().ok());
}

// The fixture's node started again on its directory `node_dir` (a new port), with a
// quota for the tenant when `quota` is set.
std::unique_ptr<storage::Server> restart_node(const fs::path& node_dir, uint64_t quota = 0) {
  storage::ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.directory = node_dir.string();
  sc.secrets = {{"ns", kSecret}};
  sc.default_namespace_quota_bytes = quota;
  return std::move(storage::Server::start(sc)).value();
}

uint64_t stored_bytes(KvStore& store) {
  auto r = store.evict(0, 0s, soon());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->bytes_kept : 0;
}

TEST_F(StoreTest, EvictionRemovesTheLeastRecentlyUsedPromptWhole) {
  KvStore store = open(config());
  const auto a = tokens_from(1), b = tokens_from(2), c = tokens_from(3);
  for (const auto* t : {&a, &b, &c}) ASSERT_TRUE(store.put(*t, kv_.view(), soon()).ok());
  fetch_all(store, a);  // a, stored first, is the most recently used now
  const uint64_t all = stored_bytes(store);
  // Room for two of the three prompts (they code to the same size: the same KV).
  const uint64_t before = server_->counters().requests;
  auto r = store.evict(all * 2 / 3, 0s, soon());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->chunks_removed, 5u);
  // One usage listing (one page: short of the entries asked for, so the last) and a
  // remove per chunk: no stat, no record read.
  EXPECT_EQ(server_->counters().requests - before, 1u + 5u);
  EXPECT_EQ(*store.lookup(a, soon()), 480u) << "the prompt used last lost chunks";
  EXPECT_EQ(*store.lookup(c, soon()), 480u) << "the prompt stored last lost chunks";
  EXPECT_EQ(*store.lookup(b, soon()), 0u);
}

TEST_F(StoreTest, APutIntoAFullStoreMakesRoomFromTheLeastRecentlyUsed) {
  const auto a = tokens_from(1), b = tokens_from(2), c = tokens_from(3);
  uint64_t one = 0;
  {
    KvStore store = open(config());
    ASSERT_TRUE(store.put(a, kv_.view(), soon()).ok());
    one = quota_bytes_used();
    ASSERT_TRUE(store.put(b, kv_.view(), soon()).ok());
    fetch_all(store, a);
  }
  // The tenant's quota: room for two prompts and a little, not three.
  server_.reset();
  server_ = restart_node(dir_ / "node", one * 2 + one / 4);
  StoreConfig cfg = config();
  ASSERT_TRUE(cfg.set("eviction.when_full", "true").ok());
  ASSERT_TRUE(cfg.set("eviction.when_full_fraction", "0").ok());
  KvStore store = open(cfg);
  auto put = store.put(c, kv_.view(), soon());
  ASSERT_TRUE(put.ok()) << put.status().to_string();
  EXPECT_GT(put->evicted_chunks, 0u);
  EXPECT_EQ(*store.lookup(a, soon()), 480u) << "the prompt used last made room";
  EXPECT_EQ(*store.lookup(c, soon()), 480u);
  // b made the room, deepest first: what is left of it is a prefix.
  const uint64_t kept_b = *store.lookup(b, soon());
  EXPECT_LT(kept_b, 480u);
  const auto kb = store.chunk_keys(b);
  auto listed = store.client().list(soon());
  ASSERT_TRUE(listed.ok());
  for (size_t i = kept_b / kChunk; i < kb.size(); ++i)
    EXPECT_EQ(std::count(listed->begin(), listed->end(), kb[i]), 0) << "chunk " << i << " of b outlived its prefix";
}

// Marks are kept beside the chunks across a restart of the node; a chunk whose mark is
// missing (stored before marks) goes before every marked one, deepest first.
TEST_F(StoreTest, UnmarkedChunksGoFirstAndMarksOutliveARestart) {
  const auto a = tokens_from(1), b = tokens_from(2);
  uint64_t one = 0;
  std::vector<std::string> keys_b;
  {
    KvStore store = open(config());
    ASSERT_TRUE(store.put(a, kv_.view(), soon()).ok());
    one = stored_bytes(store);
    ASSERT_TRUE(store.put(b, kv_.view(), soon()).ok());  // newer than a
    keys_b = store.chunk_keys(b);
  }
  server_.reset();
  for (const auto& k : keys_b) ASSERT_TRUE(fs::remove(dir_ / "node" / "ns" / k / "use")) << k;
  server_ = restart_node(dir_ / "node");
  KvStore store = open(config());
  auto r = store.evict(one, 0s, soon());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->chunks_removed, 5u);
  EXPECT_EQ(*store.lookup(a, soon()), 480u) << "a's marks did not outlive the restart";
  EXPECT_EQ(*store.lookup(b, soon()), 0u);
}

}  // namespace
}  // namespace kvstream::store_test

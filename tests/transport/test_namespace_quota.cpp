// Namespace quotas on a storage node (ServerConfig::namespace_quota_bytes): a tenant
// cannot keep more bytes on disk than its quota (each object's file in whole allocation
// units, so tiny objects cannot take more blocks), a refused put stores nothing and
// leaves the connection in step, overwrites are charged what they add, puts under way
// count at their declared length (so concurrent puts cannot pass the quota together),
// and what is stored is counted again after a restart.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "kvstream/storage.hpp"
#include "storage/node/chunk_store.hpp"
#include "tests/support/hang_guard.hpp"
#include "tests/support/node_process.hpp"
#include "tests/transport/node_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::test_namespace_quota {

using namespace kvstream::storage;
using namespace kvstream::transport;
using namespace std::chrono_literals;
using transport::test_util::pattern;
namespace node_util = kvstream::storage::node_test_util;

namespace {

const std::string kSecretA = "0123456789abcdef-tenant-a", kSecretB = "0123456789abcdef-tenant-b";

class NamespaceQuotaTest : public ::testing::Test {
 protected:
  /// A store over the test's directory, tenant-a bound to `units` allocation units.
  std::unique_ptr<ChunkStore> open_store(uint64_t units = 12) {
    auto s = ChunkStore::open(tmp_.path().string(), 16 << 20, budget_);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return nullptr;
    unit_ = (*s)->disk_charge(0, 0, false);  // a header alone takes one unit
    (*s)->set_quotas({0, {{"tenant-a", units * unit_}}});
    return std::move(s).value();
  }
  static ObjectKey key(uint32_t chunk, const std::string& ns = "tenant-a") { return {ns, "ctx", chunk, 0}; }
  /// The payload of an object whose file fills exactly `units` allocation units.
  [[nodiscard]] uint64_t filling(uint64_t units) const { return units * unit_ - kObjectHeaderBytes; }

  MemoryBudget budget_{64 << 20};
  node_util::TempDir tmp_{"kvstream-quota"};
  uint64_t unit_ = 0;
};

// Over the quota: refused, nothing stored; an overwrite is charged only what it adds;
// another namespace is not bound; a removed context frees its bytes. A context costs
// two units beside its objects (its directory and its use mark).
TEST_F(NamespaceQuotaTest, APutOverTheQuotaIsRefusedAndStoresNothing) {
  auto store = open_store();
  ASSERT_TRUE(store);
  EXPECT_GE(unit_, 512u);
  EXPECT_EQ(store->context_charge(), 2 * unit_);
  ASSERT_TRUE(store->put(key(0), pattern(filling(6), 1)).ok());
  const Status over = store->put(key(1), pattern(filling(6), 2));
  EXPECT_EQ(over.code(), StatusCode::no_space) << over.to_string();
  EXPECT_EQ(store->read_all(key(1)).status().code(), StatusCode::not_found);
  EXPECT_EQ(store->namespace_bytes("tenant-a"), 8 * unit_);
  EXPECT_EQ(store->quota_refusals(), 1u);

  ASSERT_TRUE(store->put(key(0), pattern(filling(9), 3)).ok()) << "6 units replaced by 9: 11 of 12";
  EXPECT_EQ(store->namespace_bytes("tenant-a"), 11 * unit_);
  EXPECT_EQ(*store->read_all(key(0)), pattern(filling(9), 3));
  EXPECT_EQ(store->put(key(1), pattern(filling(1) + 1, 4)).code(), StatusCode::no_space) << "a byte past a unit";
  ASSERT_TRUE(store->put(key(1), pattern(filling(1), 4)).ok()) << "exactly the quota";

  ASSERT_TRUE(store->put(key(0, "tenant-b"), pattern(50000, 5)).ok());
  EXPECT_EQ(store->namespace_bytes("tenant-b"), store->disk_charge(50000, 0, false) + store->context_charge());

  ASSERT_TRUE(store->remove("tenant-a", "ctx").ok());
  EXPECT_EQ(store->namespace_bytes("tenant-a"), 0u);
  EXPECT_TRUE(store->put(key(2), pattern(filling(10), 6)).ok());
}

// Tiny objects, one context each (as KvStore stores chunks): each costs a whole unit
// for its file and two for its context, so the tenant's files and directories take no
// more disk than its quota. (A byte of payload used to be charged a byte: 1-byte
// objects under a 1 MiB quota took about 8 GiB, a file block and a directory each.)
TEST_F(NamespaceQuotaTest, TinyObjectsCannotTakeMoreDiskThanTheQuota) {
  auto store = open_store();
  ASSERT_TRUE(store);
  uint32_t stored = 0;
  for (uint32_t i = 0; i < 100; ++i)
    if (store->put({"tenant-a", "ctx-" + std::to_string(i), 0, 0}, pattern(1, uint8_t(i))).ok()) ++stored;
  EXPECT_EQ(stored, 4u) << "3 units each under 12";
  EXPECT_EQ(store->namespace_bytes("tenant-a"), 12 * unit_);
  uint64_t disk = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(tmp_.path() / "tenant-a"))
    if (struct stat st {}; ::stat(f.path().c_str(), &st) == 0) disk += uint64_t(st.st_blocks) * 512;
  EXPECT_LE(disk, 12 * unit_) << "the files and directories take more disk than the quota";
  // Parts and sealing lengthen the file; the charge follows.
  EXPECT_EQ(store->disk_charge(filling(1), 1, false), 2 * unit_) << "a parts table entry past a full unit";
  EXPECT_GT(store->disk_charge(filling(2), 0, true), 2 * unit_) << "a sealed object's header and tag";
}

// A put under way holds its declared charge: a second one that would pass the quota
// with it is refused, and fits once the first is dropped. A put whose commit fails
// (its checksum) gives its claim back.
TEST_F(NamespaceQuotaTest, PutsUnderWayCountAtTheirDeclaredLength) {
  auto store = open_store();
  ASSERT_TRUE(store);
  {
    auto first = store->begin_put(key(0), filling(6));
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    EXPECT_EQ(store->begin_put(key(1), filling(6)).status().code(), StatusCode::no_space);
  }  // the first put is dropped uncommitted
  auto second = store->begin_put(key(1), filling(6));
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  const auto body = pattern(filling(6), 1);
  ASSERT_TRUE(second->append(body).ok());
  EXPECT_EQ(store->commit(std::move(*second), 12345).code(), StatusCode::corrupt_data);
  EXPECT_EQ(store->namespace_bytes("tenant-a"), 0u);
  EXPECT_TRUE(store->put(key(1), pattern(filling(10), 2)).ok()) << "the failed commit gave its claim back";
}

// Eight writers of distinct 2-unit objects at once into a context that holds a 1-unit
// object (3 units with the context's) under a 13-unit quota: exactly five are stored,
// and the namespace never holds more than its quota.
TEST_F(NamespaceQuotaTest, ConcurrentPutsCannotPassTheQuotaTogether) {
  auto store = open_store(13);
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->put(key(100), pattern(filling(1), 9)).ok());
  std::atomic<int> stored{0}, refused{0}, other{0};
  std::vector<std::thread> writers;
  for (uint32_t i = 0; i < 8; ++i)
    writers.emplace_back([&, i] {
      const Status s = store->put(key(i), pattern(filling(2), uint8_t(i)));
      (s.ok() ? stored : s.code() == StatusCode::no_space ? refused : other)++;
    });
  for (auto& w : writers) w.join();
  EXPECT_EQ(stored.load(), 5);
  EXPECT_EQ(refused.load(), 3);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(store->namespace_bytes("tenant-a"), 13 * unit_);
}

// What a namespace holds is counted from the directory when the store opens again.
TEST_F(NamespaceQuotaTest, WhatIsStoredCountsAfterARestart) {
  {
    auto store = open_store();
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->put(key(0), pattern(filling(6), 1)).ok());
  }
  auto store = open_store();
  ASSERT_TRUE(store);
  EXPECT_EQ(store->namespace_bytes("tenant-a"), 8 * unit_);
  EXPECT_EQ(store->put(key(1), pattern(filling(6), 2)).code(), StatusCode::no_space);
}

// Through a node: the tenant's put past its quota is answered no_space, the
// body is read off the wire (the connection stays usable), the node counts it; a
// namespace whose own quota is 0 is not bound by the default.
TEST_F(NamespaceQuotaTest, ANodeRefusesAPutPastTheQuotaAndKeepsServingTheTenant) {
  ServerConfig cfg = node_util::node_config(tmp_.path(), {{"tenant-a", kSecretA}, {"tenant-b", kSecretB}});
  // 4 KiB units: 6000 bytes take 8 KiB and the context 8 KiB, 4000 bytes 4 KiB more.
  cfg.default_namespace_quota_bytes = 24000;
  cfg.namespace_quota_bytes = {{"tenant-b", 0}};
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto a = node_util::connect_client((*server)->address(), "tenant-a", kSecretA);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE((*a)->put("ctx", 0, 0, pattern(6000, 1), deadline_in(10s)).ok());
  const Status over = (*a)->put("ctx", 1, 0, pattern(300000, 2), deadline_in(10s));
  EXPECT_EQ(over.code(), StatusCode::no_space) << over.to_string();
  EXPECT_NE(over.message().find("quota of 24000"), std::string::npos) << over.message();
  EXPECT_EQ((*a)->stat("ctx", deadline_in(10s))->size(), 1u) << "the refused chunk is not stored";
  EXPECT_TRUE((*a)->put("ctx", 1, 0, pattern(4000, 3), deadline_in(10s)).ok()) << "the connection is in step";
  EXPECT_EQ((*server)->counters().quota_refusals, 1u);

  auto b = node_util::connect_client((*server)->address(), "tenant-b", kSecretB);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_TRUE((*b)->put("ctx", 0, 0, pattern(300000, 4), deadline_in(10s)).ok());
}

// kvstream-server's quotas from --namespace-quotas, reread on SIGHUP: a put past the
// first file's quota is refused, and taken once the file is raised and the node told.
TEST_F(NamespaceQuotaTest, KvstreamServerRereadsItsQuotasOnSighup) {
  const auto quotas = tmp_.path() / "quotas.json", secrets = tmp_.path() / "secrets.json";
  std::ofstream(secrets) << R"({"tenant-a": ")" << kSecretA << R"("})";
  std::ofstream(quotas) << R"({"tenant-a": 1})";
  kvstream::testing::NodeProcess node;
  ASSERT_TRUE(node.start(KVSTREAM_SERVER_BIN,
                         {"--dir", (tmp_.path() / "store").string(), "--secrets", secrets.string(),
                          "--namespace-quotas", quotas.string(), "--listen", "127.0.0.1:0"},
                         "warn"));
  auto a = node_util::connect_client(node.address(), "tenant-a", kSecretA);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  const auto body = pattern(600 << 10, 1);
  ASSERT_TRUE((*a)->put("ctx", 0, 0, body, deadline_in(10s)).ok());
  EXPECT_EQ((*a)->put("ctx", 1, 0, body, deadline_in(10s)).code(), StatusCode::no_space) << "1 MiB";
  std::ofstream(quotas, std::ios::trunc) << R"({"tenant-a": 2})";
  ASSERT_EQ(::kill(node.pid(), SIGHUP), 0);
  EXPECT_TRUE(kvstream::testing::eventually([&] { return (*a)->put("ctx", 1, 0, body, deadline_in(10s)).ok(); }));
}

}  // namespace

}  // namespace kvstream::test_namespace_quota

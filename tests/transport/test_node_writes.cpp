// The storage node keeps what it acknowledged: concurrent writers of one object,
// removes racing puts, interrupted writes, a second node on one directory, objects
// copied or truncated on disk, and bodies larger than any buffer the node holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "kvstream/storage.hpp"
#include "storage/node/chunk_store.hpp"
#include "storage/protocol.hpp"
#include "tests/transport/node_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::test_node_writes {

using namespace kvstream::storage;
using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string kSecret = "0123456789abcdef-tenant-a";
using transport::test_util::pattern;
namespace node_util = kvstream::storage::node_test_util;
using node_util::TempDir;

// A node of one tenant over `backend` in a fresh directory, and its clients.
class NodeFixture {
 protected:
  explicit NodeFixture(std::string backend) : backend_(std::move(backend)) {}
  ServerConfig config() { return node_util::node_config(dir_, {{"tenant-a", kSecret}}, backend_); }
  std::unique_ptr<Client> client(const std::string& addr) {
    auto c = node_util::connect_client(addr, "tenant-a", kSecret, backend_);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  TempDir tmp_{"kvstream-node"};
  const fs::path& dir_ = tmp_.path();
  std::string backend_;
};

class NodeWrites : public ::testing::TestWithParam<std::string>, protected NodeFixture {
 protected:
  NodeWrites() : NodeFixture(GetParam()) {}
  // The object's bytes, or the status of the get.
  Result<std::vector<std::byte>> fetch(Client& c, const std::string& ctx, uint32_t chunk, uint32_t level,
                                       size_t cap = 8 << 20) {
    std::vector<std::byte> buf(cap);
    auto mr = c.register_memory(buf.data(), buf.size());
    if (!mr.ok()) return mr.status();
    KVS_ASSIGN_OR_RETURN(size_t n, c.get(ctx, chunk, level, *mr, 0, cap, deadline_in(20s)));
    buf.resize(n);
    return buf;
  }
};

// Two connections put a 4 MiB and a 2 MiB body to one object at the same moment: each
// is acknowledged or told it lost to the newer write, and every read (from the cache,
// then from disk after a restart) returns one of the two whole, the same one, never
// the refused one.
TEST_P(NodeWrites, ConcurrentPutsOfOneObjectLeaveOneWholeVersion) {
  const auto big = pattern(4 << 20, 1), small = pattern(2 << 20, 2);
  std::vector<std::vector<std::byte>> seen;
  {
    auto server = Server::start(config());
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    auto a = client((*server)->address()), b = client((*server)->address()), r = client((*server)->address());
    ASSERT_TRUE(a && b && r);
    for (int round = 0; round < 12; ++round) {
      Status sa, sb;
      std::thread ta([&] { sa = a->put("race", 0, 0, big, deadline_in(30s)); });
      std::thread tb([&] { sb = b->put("race", 0, 0, small, deadline_in(30s)); });
      ta.join(), tb.join();
      // Each is acknowledged, or told it lost to the newer write (and changed nothing).
      for (const Status& s : {sa, sb})
        ASSERT_TRUE(s.ok() || s.code() == StatusCode::already_exists) << s.to_string();
      ASSERT_TRUE(sa.ok() || sb.ok());
      auto got = fetch(*r, "race", 0, 0);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      ASSERT_TRUE(*got == big || *got == small) << "round " << round << ": a mix of versions";
      if (!sa.ok()) ASSERT_EQ(*got, small) << "a refused put is visible";
      if (!sb.ok()) ASSERT_EQ(*got, big) << "a refused put is visible";
      auto again = fetch(*r, "race", 0, 0);  // from the cache now
      ASSERT_TRUE(again.ok());
      ASSERT_EQ(*again, *got);
    }
    seen.push_back(*fetch(*r, "race", 0, 0));
  }
  auto server = Server::start(config());
  ASSERT_TRUE(server.ok());
  auto r = client((*server)->address());
  auto after = fetch(*r, "race", 0, 0);
  ASSERT_TRUE(after.ok()) << after.status().to_string();
  EXPECT_EQ(*after, seen.back()) << "the cache served a version the disk did not hold";
}

// A remove racing puts of the same context: every remove succeeds or says not_found,
// every put succeeds or lost to a remove made after its version; none reports an I/O
// error, and a get afterwards sees a whole put or nothing.
TEST_P(NodeWrites, RemoveRacingPutsNeverFailsWithIoError) {
  auto server = Server::start(config());
  ASSERT_TRUE(server.ok());
  auto a = client((*server)->address()), b = client((*server)->address());
  const auto body = pattern(300000, 3);
  std::atomic<bool> stop{false};
  std::vector<Status> put_errors;
  std::thread writer([&] {
    for (int i = 0; i < 60; ++i) {
      // A put whose version was drawn before a remove that committed first lost to
      // that remove (already_exists), as to a newer write.
      Status s = a->put("churn", uint32_t(i % 3), 0, body, deadline_in(20s));
      if (!s.ok() && s.code() != StatusCode::already_exists) put_errors.push_back(s);
    }
    stop = true;
  });
  int removes = 0;
  while (!stop) {
    Status s = b->remove("churn", deadline_in(20s));
    EXPECT_TRUE(s.ok() || s.code() == StatusCode::not_found) << s.to_string();
    ++removes;
  }
  writer.join();
  for (const auto& s : put_errors) ADD_FAILURE() << s.to_string();
  EXPECT_GT(removes, 0);
  for (uint32_t c = 0; c < 3; ++c) {
    auto got = fetch(*b, "churn", c, 0);
    if (got.ok()) EXPECT_EQ(*got, body);
    else EXPECT_EQ(got.status().code(), StatusCode::not_found) << got.status().to_string();
  }
}

// A remove's version travels only with its flag, and the flag only on a remove.
TEST(RemoveUpTo, TheVersionTravelsOnlyWithTheFlag) {
  Request r;
  r.op = Op::remove, r.id = 9, r.context = "ctx", r.flags = kRemoveUpTo, r.version = 123456;
  auto back = decode_request(encode(r));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->flags, kRemoveUpTo);
  EXPECT_EQ(back->version, 123456u);
  EXPECT_EQ(back->context, "ctx");
  r.flags = 0;
  back = decode_request(encode(r));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->version, 0u) << "a client from before it sends no version";
  Request s;
  s.op = Op::stat, s.context = "ctx", s.flags = kRemoveUpTo;
  EXPECT_EQ(decode_request(encode(s)).status().code(), StatusCode::corrupt_data) << "the remove flag on a stat";
}

// A remove older than every write of a context (its remover's clock behind, or a
// remove handed on late) deletes nothing: the writes stay readable, across a restart.
// It took the context's directory, and with it the files of those writes, while the
// index still named them.
TEST_P(NodeWrites, ARemoveOlderThanEveryWriteKeepsThem) {
  const auto body = pattern(40000, 8);
  const uint64_t v = next_write_version();
  {
    auto server = Server::start(config());
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    auto c = client((*server)->address());
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->put_versioned("ctx", 0, 0, body, v + 20, deadline_in(10s)).ok());
    ASSERT_TRUE(c->put_versioned("ctx", 1, 0, body, v + 30, deadline_in(10s)).ok());
    ASSERT_TRUE(c->remove_up_to("ctx", v + 10, deadline_in(10s)).ok());
    for (uint32_t chunk : {0u, 1u}) {
      auto got = fetch(*c, "ctx", chunk, 0);
      ASSERT_TRUE(got.ok()) << chunk << ": " << got.status().to_string();
      EXPECT_EQ(*got, body);
    }
  }
  auto server = Server::start(config());
  ASSERT_TRUE(server.ok());
  auto c = client((*server)->address());
  ASSERT_TRUE(c);
  auto st = c->stat("ctx", deadline_in(10s));
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->size(), 2u);
  auto got = fetch(*c, "ctx", 1, 0);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, body);
}

// A batch of removes: its flag alone on a remove, with a body and no context; the
// body's entries each a context and a version, none 0, whole.
TEST(RemoveUpTo, ABatchTravelsAsABodyOfRemoves) {
  const std::vector<ContextRemove> removes = {{"a", 5}, {"ctx-b", 1ull << 60}};
  const auto body = encode_removes(removes);
  auto back = decode_removes(body);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, removes);
  for (size_t cut = 0; cut < body.size(); ++cut) EXPECT_FALSE(decode_removes(std::span(body).first(cut)).ok()) << cut;
  EXPECT_EQ(decode_removes(encode_removes(std::vector<ContextRemove>{{"a", 0}})).status().code(),
            StatusCode::corrupt_data)
      << "a remove of no write";
  EXPECT_EQ(decode_removes(encode_removes(std::vector<ContextRemove>{{"../x", 3}})).status().code(),
            StatusCode::invalid_argument);
  Request r;
  r.op = Op::remove, r.id = 3, r.flags = kRemoveBatch, r.total = body.size(), r.checksum = body_checksum(body);
  auto req = decode_request(encode(r));
  ASSERT_TRUE(req.ok()) << req.status().to_string();
  EXPECT_EQ(req->flags, kRemoveBatch);
  EXPECT_EQ(req->total, body.size());
  EXPECT_EQ(req->checksum, r.checksum);
  r.context = "ctx";
  EXPECT_EQ(decode_request(encode(r)).status().code(), StatusCode::corrupt_data) << "a batch naming a context";
  r.context.clear(), r.total = kMaxRemoveBatchBytes + 1;
  EXPECT_EQ(decode_request(encode(r)).status().code(), StatusCode::corrupt_data) << "a body over one segment";
  r.total = body.size(), r.flags = kRemoveBatch | kRemoveUpTo;
  EXPECT_EQ(decode_request(encode(r)).status().code(), StatusCode::corrupt_data) << "both remove flags";
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> junk(rng() % 80);
    for (auto& b : junk) b = std::byte(rng());
    (void)decode_removes(junk);
  }
}

// A batch of removes does each as remove_up_to: a context the batch covers goes,
// one written after its remove's version stays, one never stored is remembered; all
// with one request (and one sync of the node's file of removes).
TEST_P(NodeWrites, ABatchOfRemovesIsEachARemove) {
  const auto body = pattern(20000, 7);
  const uint64_t v = next_write_version();
  auto server = Server::start(config());
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto c = client((*server)->address());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->put_versioned("a", 0, 0, body, v, deadline_in(10s)).ok());
  ASSERT_TRUE(c->put_versioned("b", 0, 0, body, v + 20, deadline_in(10s)).ok());
  const uint64_t before = (*server)->counters().requests;
  std::vector<ContextRemove> removes = {{"a", v + 10}, {"never", v + 10}, {"b", v + 10}};
  ASSERT_TRUE(c->remove_many(removes, deadline_in(10s)).ok());
  EXPECT_EQ((*server)->counters().requests, before + 1) << "one request for the batch";
  EXPECT_EQ(fetch(*c, "a", 0, 0).status().code(), StatusCode::not_found);
  auto kept = fetch(*c, "b", 0, 0);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_EQ(*kept, body);
  EXPECT_EQ(c->put_versioned("never", 0, 0, body, v + 5, deadline_in(10s)).code(), StatusCode::already_exists);
  EXPECT_EQ((*server)->counters().removes_remembered, 3u);
  // Many more than one request holds (1 MiB of them): every one is done.
  removes.clear();
  for (int i = 0; i < 20000; ++i) removes.push_back({fmt::format("ctx-{:0>60}", i), v + 10});
  ASSERT_TRUE(c->remove_many(removes, deadline_in(30s)).ok());
  EXPECT_EQ((*server)->counters().removes_remembered, 20003u);
  removes = {{"bad/id", v}};
  EXPECT_EQ(c->remove_many(removes, deadline_in(10s)).code(), StatusCode::invalid_argument);
}

// A remove deletes the writes made before it; a write newer than the remove (here
// one stamped an hour ahead of the remover's clock, as a writer whose put crossed
// the remove on the wire would be) stays, with its context, across a restart. A
// context of older writes only goes whole.
TEST_P(NodeWrites, ARemoveLeavesTheWritesNewerThanItself) {
  const auto older = pattern(50000, 4), newer = pattern(70000, 5);
  const uint64_t ahead = next_write_version() + uint64_t(3600) * 1000000;
  {
    auto server = Server::start(config());
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    auto c = client((*server)->address());
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->put("mixed", 0, 0, older, deadline_in(10s)).ok());
    ASSERT_TRUE(c->put("mixed", 2, 1, older, deadline_in(10s)).ok());
    ASSERT_TRUE(c->put_versioned("mixed", 1, 0, newer, ahead, deadline_in(10s)).ok());
    ASSERT_TRUE(c->put("old", 0, 0, older, deadline_in(10s)).ok());
    ASSERT_TRUE(c->remove("mixed", deadline_in(10s)).ok());
    ASSERT_TRUE(c->remove("old", deadline_in(10s)).ok());
    auto st = c->stat("mixed", deadline_in(10s));
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    ASSERT_EQ(st->size(), 1u);
    EXPECT_EQ(st->front().chunk, 1u);
    auto usage = c->usage("mixed", deadline_in(10s));
    ASSERT_TRUE(usage.ok()) << usage.status().to_string();
    ASSERT_EQ(usage->size(), 1u);
    EXPECT_EQ(usage->front().bytes, newer.size());
    auto gone = c->stat("old", deadline_in(10s));
    EXPECT_EQ(gone.status().code(), StatusCode::not_found) << gone.status().to_string();
  }
  auto server = Server::start(config());
  ASSERT_TRUE(server.ok());
  auto c = client((*server)->address());
  ASSERT_TRUE(c);
  auto kept = fetch(*c, "mixed", 1, 0);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_EQ(*kept, newer);
  EXPECT_EQ(fetch(*c, "mixed", 0, 0).status().code(), StatusCode::not_found);
  EXPECT_EQ(fetch(*c, "mixed", 2, 1).status().code(), StatusCode::not_found);
  auto names = c->list(deadline_in(10s));
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"mixed"});
}

// A remove is remembered: a copy of the context written before it (a put that
// crossed it, a rebalance from a node that was away) is refused and reads nothing,
// and a write after it is kept. remove_up_to carries a remove made elsewhere at its
// own version, to a node that never held the context too.
TEST_P(NodeWrites, ACopyOlderThanARemoveIsRefused) {
  const auto body = pattern(30000, 6);
  const uint64_t v = next_write_version();
  auto server = Server::start(config());
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto c = client((*server)->address());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->put_versioned("ctx", 0, 0, body, v, deadline_in(10s)).ok());
  ASSERT_TRUE(c->remove_up_to("ctx", v + 100, deadline_in(10s)).ok());
  EXPECT_EQ(c->put_versioned("ctx", 0, 0, body, v + 50, deadline_in(10s)).code(), StatusCode::already_exists);
  EXPECT_EQ(fetch(*c, "ctx", 0, 0).status().code(), StatusCode::not_found);
  EXPECT_EQ(c->stat("ctx", deadline_in(10s)).status().code(), StatusCode::not_found);
  EXPECT_EQ(c->remove_up_to("elsewhere", v + 100, deadline_in(10s)).code(), StatusCode::not_found);
  EXPECT_EQ(c->put_versioned("elsewhere", 0, 0, body, v + 99, deadline_in(10s)).code(), StatusCode::already_exists);
  ASSERT_TRUE(c->put_versioned("elsewhere", 0, 0, body, v + 101, deadline_in(10s)).ok());
  auto kept = fetch(*c, "elsewhere", 0, 0);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_EQ(*kept, body);
  EXPECT_EQ((*server)->counters().removes_remembered, 2u);
  EXPECT_EQ(c->remove_up_to("ctx", 0, deadline_in(10s)).code(), StatusCode::invalid_argument);
}

// Bodies larger than the node's whole memory budget stream through it both ways.
TEST_P(NodeWrites, BodiesLargerThanTheBudgetStream) {
  auto cfg = config();
  cfg.cache_bytes = 0;
  cfg.memory_budget_bytes = 4 << 20;
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto c = client((*server)->address());
  const auto body = pattern((12 << 20) + 12345, 4);
  ASSERT_TRUE(c->put("huge", 1, 2, body, deadline_in(30s)).ok());
  auto got = fetch(*c, "huge", 1, 2, 16 << 20);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, body);
  const auto counters = (*server)->counters();
  EXPECT_LE(counters.budget_peak_bytes, counters.budget_limit_bytes);
  EXPECT_GT(counters.budget_peak_bytes, 0u);
  // A buffer too small for it is told so and the connection keeps working.
  auto small = fetch(*c, "huge", 1, 2, 1 << 20);
  EXPECT_EQ(small.status().code(), StatusCode::out_of_range);
  EXPECT_TRUE(fetch(*c, "huge", 1, 2, 16 << 20).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, NodeWrites, ::testing::ValuesIn(available_backends()),
                         [](const auto& info) { return info.param; });

class NodeLayout : public ::testing::Test, protected NodeFixture {
 protected:
  NodeLayout() : NodeFixture("tcp") {}
  Status get_status(Client& c, const std::string& ctx, uint32_t chunk, uint32_t level) {
    std::vector<std::byte> buf(1 << 20);
    auto mr = c.register_memory(buf.data(), buf.size());
    return c.get(ctx, chunk, level, *mr, 0, buf.size(), deadline_in(10s)).status();
  }
};

TEST_F(NodeLayout, SecondNodeOnOneDirectoryIsRefused) {
  auto first = Server::start(config());
  ASSERT_TRUE(first.ok());
  auto second = Server::start(config());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::already_exists) << second.status().to_string();
  (*first)->stop();
  first->reset();
  EXPECT_TRUE(Server::start(config()).ok()) << "the lock goes with the node";
}

TEST_F(NodeLayout, TemporariesOfInterruptedWritesAreRemovedAtStart) {
  {
    auto s = Server::start(config());
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(client((*s)->address())->put("ctx", 0, 0, pattern(1000, 1), deadline_in(10s)).ok());
  }
  std::ofstream(dir_ / ".tmp" / "w123-4") << "half a put";
  std::ofstream(dir_ / "tenant-a" / "ctx" / "c1.l0.tmp") << "an older layout's half put";
  auto s = Server::start(config());
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(fs::is_empty(dir_ / ".tmp"));
  EXPECT_FALSE(fs::exists(dir_ / "tenant-a" / "ctx" / "c1.l0.tmp"));
  auto c = client((*s)->address());
  auto st = c->stat("ctx", deadline_in(10s));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->size(), 1u);
}

// An object's header binds its name: a file copied to another chunk's name is not
// served as that chunk, and never appears in stat.
TEST_F(NodeLayout, CopiedObjectIsNotServedUnderAnotherName) {
  {
    auto s = Server::start(config());
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(client((*s)->address())->put("ctx", 10, 0, pattern(5000, 10), deadline_in(10s)).ok());
  }
  fs::copy_file(dir_ / "tenant-a" / "ctx" / "c10.l0", dir_ / "tenant-a" / "ctx" / "c11.l0");
  auto s = Server::start(config());
  ASSERT_TRUE(s.ok());
  auto c = client((*s)->address());
  EXPECT_NE(get_status(*c, "ctx", 11, 0).code(), StatusCode::ok);
  EXPECT_TRUE(get_status(*c, "ctx", 10, 0).ok());
  auto st = c->stat("ctx", deadline_in(10s));
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->size(), 1u);
  EXPECT_EQ((*st)[0].chunk, 10u);
  // Also when the copy is made while the node runs.
  fs::copy_file(dir_ / "tenant-a" / "ctx" / "c10.l0", dir_ / "tenant-a" / "ctx" / "c12.l0");
  EXPECT_EQ(get_status(*c, "ctx", 12, 0).code(), StatusCode::corrupt_data);
}

// A truncated object is reported corrupt and leaves stat at once, not at a restart.
TEST_F(NodeLayout, TruncatedObjectLeavesStat) {
  auto s = Server::start(config());
  ASSERT_TRUE(s.ok());
  auto c = client((*s)->address());
  ASSERT_TRUE(c->put("ctx", 0, 0, pattern(5000, 1), deadline_in(10s)).ok());
  ASSERT_TRUE(c->put("ctx", 1, 0, pattern(5000, 2), deadline_in(10s)).ok());
  // Evict it from the cache by writing it again under a different size? No: a put
  // drops the cache entry; the truncation below happens behind the node's back.
  fs::resize_file(dir_ / "tenant-a" / "ctx" / "c1.l0", 1000);
  EXPECT_EQ(get_status(*c, "ctx", 1, 0).code(), StatusCode::corrupt_data);
  auto st = c->stat("ctx", deadline_in(10s));
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->size(), 1u);
  EXPECT_EQ((*st)[0].chunk, 0u);
}

// Error replies name objects, never the server's files.
TEST_F(NodeLayout, ErrorRepliesNameNoServerPath) {
  auto s = Server::start(config());
  ASSERT_TRUE(s.ok());
  auto c = client((*s)->address());
  ASSERT_TRUE(c->put("ctx1", 0, 0, pattern(100, 1), deadline_in(10s)).ok());
  const Status missing = get_status(*c, "ctx1", 5, 0);
  EXPECT_EQ(missing.code(), StatusCode::not_found);
  EXPECT_EQ(missing.message().find(dir_.string()), std::string::npos) << missing.message();
  EXPECT_EQ(missing.message().find('/' + std::string("tmp")), std::string::npos) << missing.message();
  const Status gone = c->remove("nothing-here", deadline_in(10s));
  EXPECT_EQ(gone.message().find(dir_.string()), std::string::npos) << gone.message();
}

// The store alone: a put whose body does not match the checksum its client declared
// is refused and leaves the previous version in place.
TEST_F(NodeLayout, PutFailingItsChecksumKeepsThePreviousVersion) {
  MemoryBudget budget(64 << 20);
  auto store = ChunkStore::open(dir_.string(), 16 << 20, budget);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  const ObjectKey key{"tenant-a", "ctx", 0, 0};
  const auto v1 = pattern(3000, 1);
  ASSERT_TRUE((*store)->put(key, v1).ok());
  auto p = (*store)->begin_put(key, 3000);
  ASSERT_TRUE(p.ok());
  const auto v2 = pattern(3000, 2);
  ASSERT_TRUE(p->append(v2).ok());
  EXPECT_EQ((*store)->commit(std::move(*p), 12345).code(), StatusCode::corrupt_data);
  auto got = (*store)->read_all(key);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, v1);
  EXPECT_TRUE(fs::is_empty(dir_ / ".tmp")) << "the refused put left its temporary file";
}

// Write versions: the newest wins whatever order writes arrive in, an older or equal
// one is refused and changes nothing, an unversioned write goes after the stored one,
// and versions survive a restart.
TEST_F(NodeLayout, OlderWriteVersionIsRefused) {
  const ObjectKey key{"tenant-a", "ctx", 0, 0};
  const auto v1 = pattern(3000, 1), v2 = pattern(2000, 2), v3 = pattern(1000, 3);
  {
    MemoryBudget budget(64 << 20);
    auto store = ChunkStore::open(dir_.string(), 16 << 20, budget);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->put(key, v2, 200).ok());
    EXPECT_EQ((*store)->put(key, v1, 100).code(), StatusCode::already_exists);
    EXPECT_EQ((*store)->put(key, v1, 200).code(), StatusCode::already_exists);
    EXPECT_EQ(*(*store)->read_all(key), v2);
  }
  MemoryBudget budget(64 << 20);
  auto store = ChunkStore::open(dir_.string(), 16 << 20, budget);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->put(key, v1, 150).code(), StatusCode::already_exists) << "the version is on disk";
  ASSERT_TRUE((*store)->put(key, v3).ok());  // unversioned: after 200
  EXPECT_EQ(*(*store)->read_all(key), v3);
  EXPECT_EQ((*store)->put(key, v1, 201).code(), StatusCode::already_exists);
  EXPECT_TRUE((*store)->put(key, v1, 202).ok());
  EXPECT_EQ(*(*store)->read_all(key), v1);
}

// ---- Parts tables on disk ----------------------------------------------------------

// An object file as nodes wrote it before parts tables (format 2: a 40-byte header, no
// table) is still served: stat lists it without parts, gets and range gets read it.
TEST_F(NodeLayout, ObjectWrittenBeforePartsStillLoads) {
  const auto payload = pattern(5000, 7);
  const std::string name = "tenant-a/ctx/c3.l1";
  std::vector<std::byte> file(40);
  auto put = [&](size_t at, auto v) { std::memcpy(file.data() + at, &v, sizeof v); };
  put(0, uint32_t(0x4f53564b)), put(4, uint16_t(2)), put(6, uint16_t(40));
  put(8, uint64_t(payload.size())), put(16, body_checksum(payload)), put(24, uint64_t(5));
  std::vector<std::byte> bound(file.begin(), file.begin() + 32);
  for (char ch : name) bound.push_back(std::byte(ch));
  put(32, body_checksum(bound));
  file.insert(file.end(), payload.begin(), payload.end());
  fs::create_directories(dir_ / "tenant-a" / "ctx");
  {
    std::ofstream out(dir_ / "tenant-a" / "ctx" / "c3.l1", std::ios::binary);
    out.write(reinterpret_cast<const char*>(file.data()), std::streamsize(file.size()));
  }
  auto s = Server::start(config());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  auto c = client((*s)->address());
  auto st = c->stat("ctx", deadline_in(10s));
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(*st, (std::vector<ChunkStat>{{3, {0, payload.size()}, {}, {0, 5}}})) << "its version read from the old header";
  std::vector<std::byte> buf(payload.size());
  auto mr = c->register_memory(buf.data(), buf.size());
  auto n = c->get("ctx", 3, 1, *mr, 0, buf.size(), deadline_in(10s));
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(buf, payload);
  auto r = c->get_range("ctx", 3, 1, 4000, 1000, *mr, 0, deadline_in(10s));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::memcmp(buf.data(), payload.data() + 4000, 1000), 0);
  // Its version is kept: an older write is refused, a newer one replaces it (now with parts).
  EXPECT_EQ(c->put_versioned("ctx", 3, 1, payload, 4, deadline_in(10s)).code(), StatusCode::already_exists);
  const std::vector<ObjectPart> parts = {{1000, 2.5}, {payload.size(), 0.5}};
  ASSERT_TRUE(c->put_parts("ctx", 3, 1, payload, parts, 6, deadline_in(10s)).ok());
  EXPECT_EQ(*c->stat("ctx", deadline_in(10s)), (std::vector<ChunkStat>{{3, {0, payload.size()}, {{}, parts}, {0, 6}}}));
}

// A range of a damaged object is never served, whether the node reads the object
// whole into memory or streams it (it verifies the whole object before it sends any
// of it), even when the damage lies outside the range; the object leaves stat.
TEST_F(NodeLayout, RangeOfADamagedObjectIsRefused) {
  for (const bool streamed : {false, true}) {
    SCOPED_TRACE(streamed ? "streamed from disk" : "read whole into memory");
    TempDir tmp("kvstream-node-damaged");
    auto cfg = node_util::node_config(tmp.path(), {{"tenant-a", kSecret}});
    if (streamed) cfg.cache_bytes = 0;
    const auto body = pattern((3 << 20) + 5, 9);
    const auto file = tmp.path() / "tenant-a" / "ctx" / "c0.l0";
    {
      auto s = Server::start(cfg);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      ASSERT_TRUE(
          client((*s)->address())
              ->put_parts("ctx", 0, 0, body, std::vector<ObjectPart>{{100, 1}, {body.size(), 0}}, 0, deadline_in(20s))
              .ok());
      ASSERT_TRUE(client((*s)->address())->put("ctx", 1, 0, pattern(100, 1), deadline_in(20s)).ok());
    }
    {  // a byte in the third segment, far from the range asked for below
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(std::streamoff(2 << 20) + 77);
      f.put('\x5a');
    }
    auto s = Server::start(cfg);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    auto c = client((*s)->address());
    std::vector<std::byte> buf(100, std::byte{0x11});
    auto mr = c->register_memory(buf.data(), buf.size());
    auto r = c->get_range("ctx", 0, 0, 0, 100, *mr, 0, deadline_in(20s));
    EXPECT_EQ(r.status().code(), StatusCode::corrupt_data) << r.status().to_string();
    EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{0x11}; }));
    auto st = c->stat("ctx", deadline_in(10s));
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    ASSERT_EQ(st->size(), 1u);
    EXPECT_EQ((*st)[0].chunk, 1u) << "the damaged object is still listed";
  }
}

// The parts table is bound into the object header: a table changed on disk makes the
// object damaged (moved aside at start), never served with another table.
TEST_F(NodeLayout, PartsTableChangedOnDiskIsDetected) {
  const auto body = pattern(4000, 3);
  {
    auto s = Server::start(config());
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(
        client((*s)->address())
            ->put_parts("ctx", 0, 0, body, std::vector<ObjectPart>{{1000, 0.75}, {4000, 0.25}}, 0, deadline_in(10s))
            .ok());
    ASSERT_TRUE(client((*s)->address())->put("ctx", 1, 0, body, deadline_in(10s)).ok());
  }
  {  // the first part's score (bytes 48..55 of the header)
    std::fstream f(dir_ / "tenant-a" / "ctx" / "c0.l0", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(50);
    f.put('\x01');
  }
  auto s = Server::start(config());
  ASSERT_TRUE(s.ok());
  auto c = client((*s)->address());
  EXPECT_EQ(get_status(*c, "ctx", 0, 0).code(), StatusCode::not_found);
  auto st = c->stat("ctx", deadline_in(10s));
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->size(), 1u);
  EXPECT_EQ((*st)[0].chunk, 1u);
  EXPECT_EQ((*st)[0].level_bytes, std::vector<uint64_t>{body.size()});
  EXPECT_TRUE((*st)[0].level_parts.empty());
  EXPECT_FALSE(fs::is_empty(dir_ / ".quarantine"));
}

// The store alone: a refused put (checksum, older version) changes neither the bytes
// nor the parts; an interrupted one (its temporary file left by a crash) leaves the
// committed object and its parts as they were after a restart.
TEST_F(NodeLayout, RefusedOrInterruptedPutKeepsTheOldPartsWithTheOldBytes) {
  const ObjectKey key{"tenant-a", "ctx", 0, 0};
  const auto v1 = pattern(3000, 1), v2 = pattern(3000, 2);
  const std::vector<ObjectPart> p1 = {{1000, 1}, {3000, 0}}, p2 = {{3000, 9}};
  {
    MemoryBudget budget(64 << 20);
    auto store = ChunkStore::open(dir_.string(), 16 << 20, budget);
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    ASSERT_TRUE((*store)->put(key, v1, 10, p1).ok());
    auto p = (*store)->begin_put(key, 3000, 11, p2);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p->append(v2).ok());
    EXPECT_EQ((*store)->commit(std::move(*p), 12345).code(), StatusCode::corrupt_data);
    EXPECT_EQ((*store)->put(key, v2, 9, p2).code(), StatusCode::already_exists);
    EXPECT_EQ((*store)->begin_put(key, 3000, 12, {{2999, 1}}).status().code(), StatusCode::invalid_argument);
    EXPECT_EQ(*(*store)->read_all(key), v1);
    EXPECT_EQ(*(*store)->stat("tenant-a", "ctx"), (std::vector<ChunkStat>{{0, {3000}, {p1}, {10}}}));
    // A put under way when the node dies: its temporary file stays behind.
    auto half = (*store)->begin_put(key, 3000, 13, p2);
    ASSERT_TRUE(half.ok());
    ASSERT_TRUE(half->append(std::span(v2).first(1500)).ok());
    std::vector<fs::path> temporaries;
    for (const auto& f : fs::directory_iterator(dir_ / ".tmp")) temporaries.push_back(f.path());
    ASSERT_EQ(temporaries.size(), 1u);
    fs::copy_file(temporaries[0], dir_ / ".tmp" / "w999-0");  // kept when the put below goes
  }
  MemoryBudget budget(64 << 20);
  auto store = ChunkStore::open(dir_.string(), 16 << 20, budget);
  ASSERT_TRUE(store.ok());
  EXPECT_TRUE(fs::is_empty(dir_ / ".tmp"));
  EXPECT_EQ(*(*store)->read_all(key), v1);
  EXPECT_EQ(*(*store)->stat("tenant-a", "ctx"), (std::vector<ChunkStat>{{0, {3000}, {p1}, {10}}}));
}

}  // namespace

}  // namespace kvstream::test_node_writes

// The storage node and client over every backend: operations, isolation, bad input,
// deadlines, cancel, a node killed mid-transfer, durability across a restart.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "kvstream/storage.hpp"
#include "storage/protocol.hpp"
#include "tests/support/hang_guard.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/transport/tls_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::test_storage {

using namespace kvstream::storage;
using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string kSecret = "0123456789abcdef-tenant-a";

// For steps a correct run finishes long before (connecting, a reply that is on its
// way): generous, so that a slow machine does not fail them. Under TSan a libfabric
// (tcp;ofi_rxm) connect alone takes about 0.7 s, and on 2 cores busy with a parallel
// ctest and a compile it took over 5 s.
constexpr auto kSlowMachine = 30s;

using transport::test_util::pattern;

class Storage : public ::testing::TestWithParam<std::string> {
 protected:
  ServerConfig server_config() {
    ServerConfig cfg;
    cfg.address = "127.0.0.1:0";
    cfg.backend = transport::test_util::config_for(GetParam());
    cfg.directory = dir_.string();
    cfg.secrets = {{"tenant-a", kSecret}, {"tenant-b", "another-secret-of-16+"}};
    return cfg;
  }
  Result<std::unique_ptr<Client>> client(const std::string& addr, const std::string& ns = "tenant-a",
                                         const std::string& secret = kSecret, uint32_t conns = 1) {
    ClientConfig cc;
    cc.address = addr;
    cc.backend = transport::test_util::config_for(GetParam());
    cc.name_space = ns;
    cc.secret = secret;
    cc.connections = conns;
    return Client::connect(cc, deadline_in(kSlowMachine));
  }
  kvstream::testing::TempDir dir_{"kvstream-storage"};
};

TEST_P(Storage, PutGetStatListRemove) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto c = client((*server)->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // Three chunks, four levels each, of different sizes.
  std::map<std::pair<uint32_t, uint32_t>, std::vector<std::byte>> stored;
  for (uint32_t chunk = 0; chunk < 3; ++chunk)
    for (uint32_t level = 0; level < 4; ++level) {
      auto b = pattern(1000 + chunk * 7919 + level * 131, chunk * 10 + level);
      ASSERT_TRUE((*c)->put("ctx-1", chunk, level, b, deadline_in(10s)).ok());
      stored[{chunk, level}] = b;
    }
  auto st = (*c)->stat("ctx-1", deadline_in(10s));
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  ASSERT_EQ(st->size(), 3u);
  for (const ChunkStat& s : *st) {
    ASSERT_EQ(s.level_bytes.size(), 4u);
    for (uint32_t l = 0; l < 4; ++l) EXPECT_EQ(s.level_bytes[l], (stored[{s.chunk, l}].size()));
  }
  std::vector<std::byte> buf(1 << 20);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  ASSERT_TRUE(mr.ok());
  for (auto& [key, bytes] : stored) {
    auto n = (*c)->get("ctx-1", key.first, key.second, *mr, 100, buf.size() - 100, deadline_in(10s));
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    ASSERT_EQ(*n, bytes.size());
    EXPECT_EQ(std::memcmp(buf.data() + 100, bytes.data(), bytes.size()), 0);
  }
  auto names = (*c)->list(deadline_in(10s));
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"ctx-1"});
  EXPECT_EQ((*c)->get("ctx-1", 9, 0, *mr, 0, buf.size(), deadline_in(10s)).status().code(), StatusCode::not_found);
  EXPECT_EQ((*c)->get("ctx-1", 0, 0, *mr, 0, 10, deadline_in(10s)).status().code(), StatusCode::out_of_range);
  ASSERT_TRUE((*c)->remove("ctx-1", deadline_in(10s)).ok());
  EXPECT_EQ((*c)->stat("ctx-1", deadline_in(10s)).status().code(), StatusCode::not_found);
  EXPECT_EQ((*c)->remove("ctx-1", deadline_in(10s)).code(), StatusCode::not_found);
}

TEST_P(Storage, ManyGetsInFlight) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok());
  auto c = client((*server)->address(), "tenant-a", kSecret, 2);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const int chunks = 64;
  const size_t size = 256 * 1024;
  std::vector<std::vector<std::byte>> bodies;
  for (int i = 0; i < chunks; ++i) bodies.push_back(pattern(size, i));
  for (int i = 0; i < chunks; ++i) ASSERT_TRUE((*c)->put("big", i, 0, bodies[i], deadline_in(10s)).ok());
  std::vector<std::byte> buf(size * chunks);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  std::vector<std::future<Result<size_t>>> fs;
  for (int i = 0; i < chunks; ++i) fs.push_back((*c)->get_future("big", i, 0, *mr, i * size, size, deadline_in(20s)));
  for (int i = 0; i < chunks; ++i) {
    auto r = fs[i].get();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_TRUE(std::equal(bodies[i].begin(), bodies[i].end(), buf.begin() + i * size)) << "chunk " << i;
  }
}

TEST_P(Storage, NamespacesAreIsolated) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok());
  auto a = client((*server)->address());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->put("secret-ctx", 0, 0, pattern(100, 1), deadline_in(10s)).ok());
  // Wrong secret, unknown namespace: refused, without saying which.
  auto wrong = client((*server)->address(), "tenant-a", "not-the-right-secret");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::permission_denied);
  auto unknown = client((*server)->address(), "tenant-z", kSecret);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::permission_denied);
  EXPECT_EQ(wrong.status().message().find("tenant-a") == std::string::npos,
            unknown.status().message().find("tenant-z") == std::string::npos);
  // Another tenant sees nothing of tenant-a.
  auto b = client((*server)->address(), "tenant-b", "another-secret-of-16+");
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE((*b)->list(deadline_in(10s))->empty());
  EXPECT_EQ((*b)->stat("secret-ctx", deadline_in(10s)).status().code(), StatusCode::not_found);
  EXPECT_GE((*server)->counters().auth_failures, 2u);
}

TEST_P(Storage, BadIdsAreRejected) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok());
  auto c = client((*server)->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  for (const std::string& bad : std::vector<std::string>{"../etc", "..", "a/b", "", std::string(300, 'x'), "sp ace"})
    EXPECT_EQ((*c)->put(bad, 0, 0, pattern(10, 1), deadline_in(5s)).code(), StatusCode::invalid_argument) << bad;
  EXPECT_EQ((*c)->put("ok", 0, 99, pattern(10, 1), deadline_in(5s)).code(), StatusCode::out_of_range);
}

TEST_P(Storage, SurvivesRestartAndDetectsDiskCorruption) {
  std::string addr;
  {
    auto server = Server::start(server_config());
    ASSERT_TRUE(server.ok());
    auto c = client((*server)->address());
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    ASSERT_TRUE((*c)->put("durable", 3, 1, pattern(5000, 3), deadline_in(10s)).ok());
    ASSERT_TRUE((*c)->put("durable", 4, 1, pattern(6000, 4), deadline_in(10s)).ok());
  }
  // A temporary file of an interrupted write is not an object.
  std::ofstream(dir_ / "tenant-a" / "durable" / "c9.l0.tmp") << "partial";
  // Flip one byte of one object on disk.
  {
    std::fstream f(dir_ / "tenant-a" / "durable" / "c4.l1", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok());
  auto c = client((*server)->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto st = (*c)->stat("durable", deadline_in(10s));
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->size(), 2u);
  std::vector<std::byte> buf(10000);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  auto good = (*c)->get("durable", 3, 1, *mr, 0, buf.size(), deadline_in(10s));
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ(std::memcmp(buf.data(), pattern(5000, 3).data(), 5000), 0);
  EXPECT_EQ((*c)->get("durable", 4, 1, *mr, 0, buf.size(), deadline_in(10s)).status().code(),
            StatusCode::corrupt_data);
}

TEST_P(Storage, DeadlineAndCancelOfGets) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok());
  auto c = client((*server)->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_TRUE((*c)->put("x", 0, 0, pattern(1000, 1), deadline_in(10s)).ok());
  std::vector<std::byte> buf(1000);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  // A deadline already past: timed_out, and the client keeps working afterwards.
  EXPECT_EQ((*c)->get("x", 0, 0, *mr, 0, 1000, Clock::now() - 1ms).status().code(), StatusCode::timed_out);
  CancelToken cancel;
  cancel.cancel();
  EXPECT_EQ((*c)->get("x", 0, 0, *mr, 0, 1000, deadline_in(10s), cancel).status().code(), StatusCode::cancelled);
  EXPECT_TRUE((*c)->get("x", 0, 0, *mr, 0, 1000, deadline_in(10s)).ok());
}

TEST_P(Storage, NodeKilledMidTransferFailsWithinDeadline) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok());
  auto c = client((*server)->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // 100 MB asked before the stop: plenty still on the wire when it comes.
  const size_t size = 1 << 20;
  std::vector<std::vector<std::byte>> bodies;
  for (int i = 0; i < 8; ++i) bodies.push_back(pattern(size, i));
  for (int i = 0; i < 8; ++i) ASSERT_TRUE((*c)->put("kill", i, 0, bodies[i], deadline_in(20s)).ok());
  std::vector<std::byte> buf(size * 200);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  // Every get ends, ok or failed, by its deadline at the latest (a hang would be
  // ctest's timeout); how soon after the stop is the machine's and not asserted. How
  // many of the first hundred land before the stop is a race, so it is not counted;
  // the hundred asked after it cannot succeed.
  std::vector<std::future<Result<size_t>>> fs;
  auto ask = [&](int i) { fs.push_back((*c)->get_future("kill", i % 8, 0, *mr, i * size, size, deadline_in(3s))); };
  for (int i = 0; i < 100; ++i) ask(i);
  (*server)->stop();
  for (int i = 100; i < 200; ++i) ask(i);
  int failed_after_stop = 0;
  for (int i = 0; i < 200; ++i) {
    auto r = fs[i].get();
    if (r.ok()) {
      // Whatever arrived is right, whole.
      EXPECT_TRUE(std::equal(bodies[i % 8].begin(), bodies[i % 8].end(), buf.begin() + i * size)) << "get " << i;
    } else if (i >= 100) {
      ++failed_after_stop;
    }
  }
  EXPECT_EQ(failed_after_stop, 100);
}

TEST_P(Storage, MalformedRequestClosesTheConnection) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok());
  BackendConfig bc = transport::test_util::config_for(GetParam());
  auto backend = create_backend(bc);
  ASSERT_TRUE(backend.ok());
  auto conn = (*backend)->connect((*server)->address(), deadline_in(kSlowMachine), {});
  ASSERT_TRUE(conn.ok()) << conn.status().to_string();
  std::vector<std::byte> header;
  auto hello = (*conn)->recv_header(header, deadline_in(kSlowMachine), {});
  ASSERT_TRUE(hello.ok()) << hello.status().to_string();
  ASSERT_TRUE((*conn)->recv_body({}, deadline_in(kSlowMachine), {}).ok());
  const std::vector<std::byte> garbage(40, std::byte{0x41});
  ASSERT_TRUE((*conn)->send(garbage, {}, deadline_in(kSlowMachine), {}).ok());
  // The server refuses (an error response or closing) and then the connection ends.
  Status end;
  for (int i = 0; i < 3 && end.ok(); ++i) {
    auto r = (*conn)->recv_header(header, deadline_in(kSlowMachine), {});
    if (!r.ok()) end = r.status();
    else end = (*conn)->recv_body({}, deadline_in(kSlowMachine), {});
  }
  EXPECT_FALSE(end.ok());
  EXPECT_NE(end.code(), StatusCode::timed_out) << end.to_string();
}

// One tenant cannot hold every connection: past its limit it is refused with
// resource_exhausted while another tenant still connects; a slot comes back when a
// connection closes.
TEST(Limits, ConnectionsPerNamespace) {
  const kvstream::testing::TempDir dir("kvstream-limits");
  ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.directory = dir.string();
  sc.secrets = {{"tenant-a", kSecret}, {"tenant-b", "another-secret-of-16+"}};
  sc.max_connections_per_namespace = 2;
  auto server = Server::start(sc);
  ASSERT_TRUE(server.ok());
  auto connect = [&](const std::string& ns, const std::string& secret) {
    ClientConfig cc;
    cc.address = (*server)->address();
    cc.name_space = ns;
    cc.secret = secret;
    return Client::connect(cc, deadline_in(5s));
  };
  auto a1 = connect("tenant-a", kSecret), a2 = connect("tenant-a", kSecret);
  ASSERT_TRUE(a1.ok() && a2.ok());
  auto a3 = connect("tenant-a", kSecret);
  EXPECT_EQ(a3.status().code(), StatusCode::resource_exhausted) << a3.status().to_string();
  auto b1 = connect("tenant-b", "another-secret-of-16+");
  EXPECT_TRUE(b1.ok()) << b1.status().to_string();
  a1->reset();
  Result<std::unique_ptr<Client>> again = Status(StatusCode::internal, "not tried");
  // The node notices the close on its own time: refused until then.
  EXPECT_TRUE(kvstream::testing::eventually([&] {
    again = connect("tenant-a", kSecret);
    return again.ok() || again.status().code() != StatusCode::resource_exhausted;
  }));
  EXPECT_TRUE(again.ok()) << again.status().to_string();
  server->reset();
}

// 64 clients of one tenant fetching at once from one node (tcp, loopback), briefly:
// no errors, every chunk whole and right, and the node keeps serving another tenant's
// client while they fetch (one busy tenant cannot starve another). The 60 s version is `kvstream-bench storage
// --clients 64 --seconds 60` (perf/results/2026-11-30/storage-load.md).
TEST(Load, SixtyFourClientsNoErrors) {
  const kvstream::testing::TempDir dir("kvstream-load-test");
  ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.directory = dir.string();
  sc.secrets = {{"tenant-a", kSecret}, {"tenant-b", "another-secret-of-16+"}};
  // Every client here is one source (loopback), and all 64 may still be authenticating
  // at once on a slow machine (TSan): at the per-source limit the node would close that
  // source's oldest login, which this test would count as an error.
  sc.max_unauthenticated_per_source = sc.max_unauthenticated;
  // And a login may take longer than the node's default 2 s there: with 64 logins at
  // once under TSan, one challenge's send passed that deadline and the node closed the
  // connection (12 errors, clean-clone run of the third pass of issue 19). This test
  // is about load, not the login deadline (test_node_limits has that).
  sc.auth_timeout = kSlowMachine;
  // 64 fetching clients and the loader before them, whose slot comes back only once
  // the node has noticed its close (on the node's own time).
  sc.max_connections_per_namespace = 65;
  auto server = Server::start(sc);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  ClientConfig cc;
  cc.address = (*server)->address();
  cc.name_space = "tenant-a";
  cc.secret = kSecret;
  constexpr uint32_t kChunks = 16;
  constexpr size_t kBytes = 256 << 10;
  {
    auto loader = Client::connect(cc, deadline_in(10s));
    ASSERT_TRUE(loader.ok());
    for (uint32_t i = 0; i < kChunks; ++i) ASSERT_TRUE((*loader)->put("load", i, 0, pattern(kBytes, i), deadline_in(10s)).ok());
  }
  std::vector<std::vector<std::byte>> expect;
  for (uint32_t i = 0; i < kChunks; ++i) expect.push_back(pattern(kBytes, i));
  // Each client fetches until told to stop, and at least kGets times; the other
  // tenant comes in once all 64 are connected and fetching, and the load stops only
  // after it was served: it was served during the load, however slow the machine.
  constexpr uint64_t kGets = 4;
  std::atomic<uint64_t> ok{0}, errors{0}, wrong{0};
  std::atomic<uint32_t> loading{0};  // clients past their first get (or that could not connect)
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 64; ++t)
    threads.emplace_back([&, t] {
      auto c = Client::connect(cc, deadline_in(kSlowMachine));
      if (!c.ok()) {
        ++errors;
        ++loading;
        return;
      }
      std::vector<std::byte> buf(kBytes);
      auto mr = (*c)->register_memory(buf.data(), buf.size());
      std::mt19937 rng(t);
      for (uint64_t n = 0; n < kGets || !stop; ++n) {
        const uint32_t i = rng() % kChunks;
        auto r = (*c)->get("load", i, 0, *mr, 0, buf.size(), deadline_in(kSlowMachine));
        if (n == 0) ++loading;
        if (!r.ok()) {
          ++errors;
          continue;
        }
        if (*r != kBytes || std::memcmp(buf.data(), expect[i].data(), kBytes) != 0) ++wrong;
        ++ok;
      }
    });
  // Tenant-a now holds 64 connections, all busy: another tenant still connects, writes
  // and reads (its deadlines are hang guards).
  EXPECT_TRUE(kvstream::testing::eventually([&] { return loading.load() == 64; }));
  {
    ClientConfig oc = cc;
    oc.name_space = "tenant-b";
    oc.secret = "another-secret-of-16+";
    auto other = Client::connect(oc, deadline_in(kSlowMachine));
    EXPECT_TRUE(other.ok()) << other.status().to_string();
    if (other.ok()) {
      std::vector<std::byte> buf(kBytes);
      auto mr = (*other)->register_memory(buf.data(), buf.size());
      EXPECT_TRUE(mr.ok());
      EXPECT_TRUE((*other)->put("mine", 0, 0, expect[3], deadline_in(kSlowMachine)).ok());
      auto r = (*other)->get("mine", 0, 0, *mr, 0, buf.size(), deadline_in(kSlowMachine));
      EXPECT_TRUE(r.ok()) << r.status().to_string();
    }
  }
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GE(ok.load(), 64u * kGets);
  server->reset();
}

TEST(Protocol, HeadersRoundTripAndRejectGarbage) {
  Request r;
  r.op = Op::get, r.id = 77, r.chunk = 5, r.level = 3, r.context = "ctx.1_a-b";
  auto back = decode_request(encode(r));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->context, r.context);
  EXPECT_EQ(back->chunk, 5u);
  auto bytes = encode(r);
  for (size_t cut = 0; cut < bytes.size(); ++cut)
    EXPECT_FALSE(decode_request(std::span(bytes).first(cut)).ok()) << cut;
  bytes.push_back(std::byte{0});
  EXPECT_FALSE(decode_request(bytes).ok());
  std::vector<ChunkStat> st = {{1, {10, 20}}, {2, {0, 5, 7}}};
  auto sb = encode_stats(st);
  EXPECT_EQ(*decode_stats(sb), st);
  sb[8] = std::byte{0xff};  // the first chunk's level count
  EXPECT_FALSE(decode_stats(sb).ok());
  // Random garbage never crashes the parsers.
  std::mt19937 rng(3);
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> g(rng() % 64);
    for (auto& b : g) b = std::byte(rng());
    (void)decode_request(g);
    (void)decode_response(g);
    (void)decode_stats(g);
    (void)decode_names(g);
  }
}

// ---- Parts tables and range reads (a layered object's prefixes) -------------------

// A table of `n` parts over an object of `size` bytes: ends spread evenly, the last at
// `size`, scores falling as a codec's distortion would.
std::vector<ObjectPart> parts_of(uint64_t size, size_t n) {
  std::vector<ObjectPart> parts;
  for (size_t i = 1; i <= n; ++i) parts.push_back({size * i / n, 100.0 / double(i) - 0.125});
  return parts;
}

TEST(Protocol, RangeAndPartsRoundTripAndMalformedOnesAreRefused) {
  // A put with a full parts table fits one transport header and comes back whole.
  Request put;
  put.op = Op::put, put.id = 9, put.chunk = 1, put.level = 2, put.total = 1 << 20, put.checksum = 7, put.version = 5;
  put.context = std::string(kMaxContextBytes, 'c');
  put.parts = parts_of(put.total, kMaxObjectParts);
  put.flags = kMembersRevision, put.members_revision = 1;  // as a replicated client sends it
  const auto bytes = encode(put);
  EXPECT_EQ(bytes.size(), kMaxRequestHeaderBytes);  // the largest request there is
  auto back = decode_request(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->parts, put.parts);
  EXPECT_EQ(back->total, put.total);
  for (size_t cut = 0; cut < bytes.size(); ++cut) EXPECT_FALSE(decode_request(std::span(bytes).first(cut)).ok()) << cut;
  // Tables that do not describe the body are corrupt_data, never a crash.
  const std::vector<std::vector<ObjectPart>> bad = {
      {{100, 1}, {100, 2}, {put.total, 3}},  // not increasing
      {{0, 1}, {put.total, 2}},              // a part of no bytes
      {{100, 1}, {put.total - 1, 2}},        // the last does not end at the body's end
      {{put.total, std::nan("")}},           // a score that is not finite
  };
  for (const auto& parts : bad) {
    Request r = put;
    r.parts = parts;
    auto d = decode_request(encode(r));
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), StatusCode::corrupt_data) << d.status().to_string();
  }
  // A count past the bound: the count byte sits right after the put's fixed fields
  // (the member-set revision among them).
  auto over = bytes;
  over[4 + 1 + 1 + 2 + 8 + 4 + 4 + 8 + 24] = std::byte{kMaxObjectParts + 1};
  EXPECT_EQ(decode_request(over).status().code(), StatusCode::corrupt_data);
  // A range get comes back whole; a range of no length at an offset is malformed; one
  // past the largest object is out_of_range.
  Request get;
  get.op = Op::get, get.id = 3, get.context = "ctx", get.range_offset = 12345, get.range_length = 678;
  auto g = decode_request(encode(get));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->range_offset, 12345u);
  EXPECT_EQ(g->range_length, 678u);
  get.range_length = 0;
  EXPECT_EQ(decode_request(encode(get)).status().code(), StatusCode::corrupt_data);
  get.range_offset = kMaxChunkBytes, get.range_length = 1;
  EXPECT_EQ(decode_request(encode(get)).status().code(), StatusCode::out_of_range);
  // Another protocol version is refused with a message that says so.
  auto old = encode(get);
  old[4] = std::byte{2};
  auto v = decode_request(old);
  EXPECT_EQ(v.status().code(), StatusCode::unsupported);
  EXPECT_NE(v.status().message().find("protocol version 2"), std::string::npos) << v.status().message();
  // Stat bodies carry each level's parts; they are checked against the level's size.
  std::vector<ChunkStat> st = {{1, {10, 20, 30}, {{{4, 1.5}, {10, 0.5}}, {}, {{30, 2}}}}, {2, {0, 5}, {}}};
  auto sb = encode_stats(st);
  auto sd = decode_stats(sb);
  ASSERT_TRUE(sd.ok()) << sd.status().to_string();
  EXPECT_EQ(*sd, st);
  std::vector<ChunkStat> untrimmed = {{1, {10, 20}, {{}, {}}}};
  EXPECT_EQ(*decode_stats(encode_stats(untrimmed)), (std::vector<ChunkStat>{{1, {10, 20}, {}}}));
  std::vector<ChunkStat> lying = {{1, {10}, {{{4, 1}, {11, 0}}}}};  // a part past the level's end
  EXPECT_EQ(decode_stats(encode_stats(lying)).status().code(), StatusCode::corrupt_data);
  // validate_parts itself.
  EXPECT_TRUE(validate_parts({}, 0).ok());
  EXPECT_TRUE(validate_parts(parts_of(1000, kMaxObjectParts), 1000).ok());
  EXPECT_EQ(validate_parts(parts_of(1000, kMaxObjectParts + 1), 1000).code(), StatusCode::invalid_argument);
  EXPECT_EQ(validate_parts(parts_of(1000, 3), 999).code(), StatusCode::invalid_argument);
}

// The node keeps each level's parts with its bytes: stat returns them, a restart keeps
// them, a put without parts clears them, and bad tables are refused before anything is
// sent.
TEST_P(Storage, PartsAreKeptWithTheObject) {
  const auto b0 = pattern(50000, 1), b1 = pattern(7000, 2), b2 = pattern(3 << 20, 3);
  const auto p0 = parts_of(b0.size(), 3), p2 = parts_of(b2.size(), kMaxObjectParts);
  {
    auto server = Server::start(server_config());
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    auto c = client((*server)->address());
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    ASSERT_TRUE((*c)->put_parts("layered", 0, 0, b0, p0, 0, deadline_in(10s)).ok());
    ASSERT_TRUE((*c)->put("layered", 0, 1, b1, deadline_in(10s)).ok());
    ASSERT_TRUE((*c)->put_parts("layered", 0, 2, b2, p2, next_write_version(), deadline_in(20s)).ok());
    ASSERT_TRUE((*c)->put_parts("layered", 1, 0, b1, {}, 0, deadline_in(10s)).ok());
    for (const auto& bad : std::vector<std::vector<ObjectPart>>{parts_of(b1.size() + 1, 2),
                                                                parts_of(b1.size(), kMaxObjectParts + 1),
                                                                {{b1.size(), std::numeric_limits<double>::infinity()}}})
      EXPECT_EQ((*c)->put_parts("layered", 1, 1, b1, bad, 0, deadline_in(10s)).code(), StatusCode::invalid_argument);
    const std::vector<ChunkStat> want = {{0, {b0.size(), b1.size(), b2.size()}, {p0, {}, p2}}, {1, {b1.size()}, {}}};
    auto st = (*c)->stat("layered", deadline_in(10s));
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    ASSERT_EQ(st->size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ((*st)[i].chunk, want[i].chunk);
      EXPECT_EQ((*st)[i].level_bytes, want[i].level_bytes);
      EXPECT_EQ((*st)[i].level_parts, want[i].level_parts);
      EXPECT_EQ((*st)[i].level_versions.size(), want[i].level_bytes.size()) << "a version per level";
    }
  }
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto c = client((*server)->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto st = (*c)->stat("layered", deadline_in(10s));
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  ASSERT_EQ(st->size(), 2u);
  EXPECT_EQ((*st)[0].level_parts, (std::vector<std::vector<ObjectPart>>{p0, {}, p2})) << "a restart lost the parts";
  // A put without parts replaces bytes and parts together: the parts go.
  ASSERT_TRUE((*c)->put("layered", 0, 2, b1, deadline_in(10s)).ok());
  st = (*c)->stat("layered", deadline_in(10s));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*st)[0].level_bytes, (std::vector<uint64_t>{b0.size(), b1.size(), b1.size()}));
  EXPECT_EQ((*st)[0].level_parts, (std::vector<std::vector<ObjectPart>>{p0}));
  // Every level's write version; the one just written is the newest.
  ASSERT_EQ((*st)[0].level_versions.size(), 3u);
  EXPECT_GT((*st)[0].level_versions[2], std::max((*st)[0].level_versions[0], (*st)[0].level_versions[1]));
  // And a put with parts after one without sets them again.
  ASSERT_TRUE((*c)->put_parts("layered", 0, 1, b0, p0, 0, deadline_in(10s)).ok());
  EXPECT_EQ((*(*c)->stat("layered", deadline_in(10s)))[0].level_parts, (std::vector<std::vector<ObjectPart>>{p0, p0}));
}

// Ranges of an object that the node holds in memory and of one it streams from disk
// (cache 0): first byte, last byte, the whole, a middle range across a 1 MiB segment
// boundary and one of several segments; each lands at its place and nothing else in
// the destination changes.
TEST_P(Storage, RangesEqualTheSlices) {
  for (const bool streamed : {false, true}) {
    SCOPED_TRACE(streamed ? "streamed from disk" : "served from memory");
    auto cfg = server_config();
    if (streamed) cfg.cache_bytes = 0;
    auto server = Server::start(cfg);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    auto c = client((*server)->address());
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    const uint64_t size = (3 << 20) + 12345;
    const auto obj = pattern(size, 11);
    ASSERT_TRUE((*c)->put_parts("ranges", 4, 1, obj, parts_of(size, 4), 0, deadline_in(20s)).ok());
    const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
        {0, 1}, {size - 1, 1}, {0, size}, {kSegmentBytes - 1000, 5000}, {500000, (2 << 20) + 7}, {kSegmentBytes, 1}};
    const size_t at = 777;  // where in the destination the range lands
    std::vector<std::byte> buf(size + 2 * at);
    auto mr = (*c)->register_memory(buf.data(), buf.size());
    ASSERT_TRUE(mr.ok());
    for (const auto& [offset, length] : ranges) {
      std::fill(buf.begin(), buf.end(), std::byte{0xee});
      auto n = (*c)->get_range("ranges", 4, 1, offset, length, *mr, at, deadline_in(20s));
      ASSERT_TRUE(n.ok()) << offset << "+" << length << ": " << n.status().to_string();
      EXPECT_EQ(*n, length);
      EXPECT_EQ(std::memcmp(buf.data() + at, obj.data() + offset, length), 0) << offset << "+" << length;
      EXPECT_TRUE(std::all_of(buf.begin(), buf.begin() + at, [](std::byte b) { return b == std::byte{0xee}; }));
      EXPECT_TRUE(
          std::all_of(buf.begin() + long(at + length), buf.end(), [](std::byte b) { return b == std::byte{0xee}; }));
    }
    // Several in flight at once, each into its own place.
    std::vector<std::future<Result<size_t>>> fs;
    std::vector<std::byte> many(64 * 4096);
    auto mm = (*c)->register_memory(many.data(), many.size());
    ASSERT_TRUE(mm.ok());
    for (uint64_t i = 0; i < 64; ++i) {
      auto p = std::make_shared<std::promise<Result<size_t>>>();
      fs.push_back(p->get_future());
      (*c)->get_range_async("ranges", 4, 1, i * 49999, 4096, *mm, i * 4096, deadline_in(20s), {},
                            [p](Result<size_t> r) { p->set_value(std::move(r)); });
    }
    for (uint64_t i = 0; i < 64; ++i) {
      auto r = fs[i].get();
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_EQ(std::memcmp(many.data() + i * 4096, obj.data() + i * 49999, 4096), 0) << i;
    }
  }
}

// A range that ends past the object is out_of_range and writes nothing; other bad
// ranges are refused as documented; the connection keeps working after each.
TEST_P(Storage, RangePastTheEndLeavesTheDestinationUntouched) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto c = client((*server)->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const uint64_t size = 100000;
  const auto obj = pattern(size, 5);
  ASSERT_TRUE((*c)->put("short", 0, 0, obj, deadline_in(10s)).ok());
  std::vector<std::byte> buf(2 * size, std::byte{0x5c});
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  ASSERT_TRUE(mr.ok());
  for (const auto& [offset, length] :
       std::vector<std::pair<uint64_t, uint64_t>>{{size - 10, 11}, {size, 1}, {size + 100, 5}, {0, size + 1}}) {
    auto r = (*c)->get_range("short", 0, 0, offset, length, *mr, 0, deadline_in(10s));
    EXPECT_EQ(r.status().code(), StatusCode::out_of_range) << offset << "+" << length << ": " << r.status().to_string();
    EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{0x5c}; }))
        << offset << "+" << length << " wrote into the destination";
  }
  EXPECT_EQ((*c)->get_range("short", 0, 0, 0, 0, *mr, 0, deadline_in(10s)).status().code(),
            StatusCode::invalid_argument);
  EXPECT_EQ((*c)->get_range("short", 0, 0, 0, 10, *mr, buf.size() - 5, deadline_in(10s)).status().code(),
            StatusCode::invalid_argument);
  EXPECT_EQ((*c)->get_range("short", 9, 0, 0, 10, *mr, 0, deadline_in(10s)).status().code(), StatusCode::not_found);
  EXPECT_EQ((*c)->get_range("short", 0, kMaxLevels, 0, 10, *mr, 0, deadline_in(10s)).status().code(),
            StatusCode::out_of_range);
  EXPECT_EQ((*c)->get_range("short", 0, 0, kMaxChunkBytes, 10, *mr, 0, deadline_in(10s)).status().code(),
            StatusCode::out_of_range);
  EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{0x5c}; }));
  auto n = (*c)->get_range("short", 0, 0, size - 10, 10, *mr, 0, deadline_in(10s));
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(std::memcmp(buf.data(), obj.data() + size - 10, 10), 0);
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Backends, Storage, ::testing::ValuesIn(transport::test_util::backend_params()),
                         [](const auto& info) { return info.param; });

}  // namespace kvstream::test_storage

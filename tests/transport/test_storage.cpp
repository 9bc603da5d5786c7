// The storage node and client over every backend: operations, isolation, bad input,
// deadlines, cancel, a node killed mid-transfer, durability across a restart.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "kvstream/storage.hpp"
#include "storage/protocol.hpp"

using namespace kvstream;
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

std::vector<std::byte> blob(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = std::byte(rng());
  return v;
}

class Storage : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("kvstream-storage-{}-{}", ::getpid(), counter_++);
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  ServerConfig server_config() {
    ServerConfig cfg;
    cfg.address = "127.0.0.1:0";
    cfg.backend.name = GetParam();
    cfg.directory = dir_.string();
    cfg.secrets = {{"tenant-a", kSecret}, {"tenant-b", "another-secret-of-16+"}};
    return cfg;
  }
  Result<std::unique_ptr<Client>> client(const std::string& addr, const std::string& ns = "tenant-a",
                                         const std::string& secret = kSecret, uint32_t conns = 1) {
    ClientConfig cc;
    cc.address = addr;
    cc.backend.name = GetParam();
    cc.name_space = ns;
    cc.secret = secret;
    cc.connections = conns;
    return Client::connect(cc, deadline_in(kSlowMachine));
  }
  fs::path dir_;
  static inline int counter_ = 0;
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
      auto b = blob(1000 + chunk * 7919 + level * 131, chunk * 10 + level);
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
  for (int i = 0; i < chunks; ++i) ASSERT_TRUE((*c)->put("big", i, 0, blob(size, i), deadline_in(10s)).ok());
  std::vector<std::byte> buf(size * chunks);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  std::vector<std::future<Result<size_t>>> fs;
  for (int i = 0; i < chunks; ++i) fs.push_back((*c)->get_future("big", i, 0, *mr, i * size, size, deadline_in(20s)));
  for (int i = 0; i < chunks; ++i) {
    auto r = fs[i].get();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(buf[i * size + 12345], blob(size, i)[12345]);
  }
}

TEST_P(Storage, NamespacesAreIsolated) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok());
  auto a = client((*server)->address());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->put("secret-ctx", 0, 0, blob(100, 1), deadline_in(10s)).ok());
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
    EXPECT_EQ((*c)->put(bad, 0, 0, blob(10, 1), deadline_in(5s)).code(), StatusCode::invalid_argument) << bad;
  EXPECT_EQ((*c)->put("ok", 0, 99, blob(10, 1), deadline_in(5s)).code(), StatusCode::out_of_range);
}

TEST_P(Storage, SurvivesRestartAndDetectsDiskCorruption) {
  std::string addr;
  {
    auto server = Server::start(server_config());
    ASSERT_TRUE(server.ok());
    auto c = client((*server)->address());
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    ASSERT_TRUE((*c)->put("durable", 3, 1, blob(5000, 3), deadline_in(10s)).ok());
    ASSERT_TRUE((*c)->put("durable", 4, 1, blob(6000, 4), deadline_in(10s)).ok());
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
  EXPECT_EQ(std::memcmp(buf.data(), blob(5000, 3).data(), 5000), 0);
  EXPECT_EQ((*c)->get("durable", 4, 1, *mr, 0, buf.size(), deadline_in(10s)).status().code(),
            StatusCode::corrupt_data);
}

TEST_P(Storage, DeadlineAndCancelOfGets) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok());
  auto c = client((*server)->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_TRUE((*c)->put("x", 0, 0, blob(1000, 1), deadline_in(10s)).ok());
  std::vector<std::byte> buf(1000);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  // A deadline already past: timed_out, and the client keeps working afterwards.
  EXPECT_EQ((*c)->get("x", 0, 0, *mr, 0, 1000, Clock::now() - 1ms).status().code(), StatusCode::timed_out);
  CancelToken cancel;
  cancel.cancel();
  EXPECT_EQ((*c)->get("x", 0, 0, *mr, 0, 1000, deadline_in(10s), cancel).status().code(), StatusCode::cancelled);
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE((*c)->get("x", 0, 0, *mr, 0, 1000, deadline_in(10s)).ok());
}

TEST_P(Storage, NodeKilledMidTransferFailsWithinDeadline) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok());
  auto c = client((*server)->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const size_t size = 4 << 20;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE((*c)->put("kill", i, 0, blob(size, i), deadline_in(20s)).ok());
  std::vector<std::byte> buf(size * 200);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  std::vector<std::future<Result<size_t>>> fs;
  const auto t0 = Clock::now();
  for (int i = 0; i < 200; ++i) fs.push_back((*c)->get_future("kill", i % 8, 0, *mr, i * size, size, deadline_in(3s)));
  (*server)->stop();
  int failed = 0;
  for (int i = 0; i < 200; ++i) {
    auto r = fs[i].get();
    if (r.ok()) {
      EXPECT_EQ(buf[i * size + 777], blob(size, i % 8)[777]);  // whatever arrived is right
    } else {
      ++failed;
    }
  }
  EXPECT_LT(Clock::now() - t0, 3s + 500ms);
  EXPECT_GT(failed, 0);
}

TEST_P(Storage, MalformedRequestClosesTheConnection) {
  auto server = Server::start(server_config());
  ASSERT_TRUE(server.ok());
  BackendConfig bc;
  bc.name = GetParam();
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
  const fs::path dir = fs::temp_directory_path() / fmt::format("kvstream-limits-{}", ::getpid());
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
  Result<std::unique_ptr<Client>> again = make_status(StatusCode::internal, "not tried");
  for (int i = 0; i < 50 && !again.ok(); ++i) {  // the node notices the close shortly
    again = connect("tenant-a", kSecret);
    if (!again.ok()) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(again.ok()) << again.status().to_string();
  server->reset();
  fs::remove_all(dir);
}

// 64 clients of one tenant fetching at once from one node (tcp, loopback), briefly:
// no errors, every chunk whole and right, and the node keeps serving another tenant's
// client promptly (one busy tenant cannot starve another). The 60 s version is `kvstream-bench storage
// --clients 64 --seconds 60` (perf/RESULTS.md).
TEST(Load, SixtyFourClientsNoErrors) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kvstream-load-test-{}", ::getpid());
  fs::remove_all(dir);
  ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.directory = dir.string();
  sc.secrets = {{"tenant-a", kSecret}, {"tenant-b", "another-secret-of-16+"}};
  // Every client here is one source (loopback), and all 64 may still be authenticating
  // at once on a slow machine (TSan): at the per-source limit the node would close that
  // source's oldest login, which this test would count as an error.
  sc.max_unauthenticated_per_source = sc.max_unauthenticated;
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
    for (uint32_t i = 0; i < kChunks; ++i) ASSERT_TRUE((*loader)->put("load", i, 0, blob(kBytes, i), deadline_in(10s)).ok());
  }
  std::vector<std::vector<std::byte>> expect;
  for (uint32_t i = 0; i < kChunks; ++i) expect.push_back(blob(kBytes, i));
  std::atomic<uint64_t> ok{0}, errors{0}, wrong{0};
  const auto end = Clock::now() + 3s;
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 64; ++t)
    threads.emplace_back([&, t] {
      auto c = Client::connect(cc, deadline_in(10s));
      if (!c.ok()) {
        ++errors;
        return;
      }
      std::vector<std::byte> buf(kBytes);
      auto mr = (*c)->register_memory(buf.data(), buf.size());
      std::mt19937 rng(t);
      while (Clock::now() < end) {
        const uint32_t i = rng() % kChunks;
        auto r = (*c)->get("load", i, 0, *mr, 0, buf.size(), deadline_in(10s));
        if (!r.ok()) {
          ++errors;
          continue;
        }
        if (*r != kBytes || std::memcmp(buf.data(), expect[i].data(), kBytes) != 0) ++wrong;
        ++ok;
      }
    });
  // Meanwhile another tenant still gets through, within a second (tenant-a now holds
  // all 64 connections its limit allows).
  std::this_thread::sleep_for(1s);
  {
    ClientConfig oc = cc;
    oc.name_space = "tenant-b";
    oc.secret = "another-secret-of-16+";
    auto other = Client::connect(oc, deadline_in(2s));
    ASSERT_TRUE(other.ok()) << other.status().to_string();
    std::vector<std::byte> buf(kBytes);
    auto mr = (*other)->register_memory(buf.data(), buf.size());
    ASSERT_TRUE(mr.ok());
    const auto t0 = Clock::now();
    ASSERT_TRUE((*other)->put("mine", 0, 0, expect[3], deadline_in(5s)).ok());
    auto r = (*other)->get("mine", 0, 0, *mr, 0, buf.size(), deadline_in(5s));
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_LT(Clock::now() - t0, 1s);
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(ok.load(), 64u);
  server->reset();
  fs::remove_all(dir);
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

std::vector<std::string> backends() {
  auto v = available_backends();
  if (v.empty()) v.push_back("none");
  return v;
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Backends, Storage, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return info.param; });

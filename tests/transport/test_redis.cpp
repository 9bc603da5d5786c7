// The Redis storage client against a redis-server started per test on a free port in
// a temporary directory (skipped when redis-server is not installed or kvstream was
// built without hiredis).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "kvstream/redis_storage.hpp"
#include "kvstream/storage.hpp"
#include "tests/transport/transport_test_util.hpp"
#include "tests/transport/redis_server.hpp"

namespace kvstream::test_redis {

using namespace kvstream::storage;
using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

class Redis : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = test_util::RedisServer::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    redis_ = std::make_unique<test_util::RedisServer>("kvstream-redis");
    ASSERT_TRUE(redis_->started()) << "redis-server did not start; see " << (redis_->dir() / "redis.log");
    dir_ = redis_->dir();
    port_ = redis_->port();
    pid_ = redis_->pid();
  }
  void TearDown() override { redis_.reset(); }

  Result<std::unique_ptr<Client>> client(std::chrono::milliseconds timeout = 5000ms, const std::string& ns = "tenant-a") {
    return redis_->client(timeout, ns);
  }

  std::unique_ptr<test_util::RedisServer> redis_;
  fs::path dir_;
  uint16_t port_ = 0;
  pid_t pid_ = -1;
};

TEST_F(Redis, PutGetStatListRemove) {
  auto c = client();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::map<std::pair<uint32_t, uint32_t>, std::vector<std::byte>> stored;
  for (uint32_t chunk = 0; chunk < 3; ++chunk)
    for (uint32_t level = 0; level < 4; ++level) {
      auto b = test_util::pattern(1000 + chunk * 7919 + level * 131, chunk * 10 + level);
      Status ps = (*c)->put("ctx-1", chunk, level, b, deadline_in(5s));
      ASSERT_TRUE(ps.ok()) << ps.to_string();
      stored[{chunk, level}] = b;
    }
  ASSERT_TRUE((*c)->put("ctx-2", 0, 0, {}, deadline_in(5s)).ok());  // an empty level is allowed
  auto st = (*c)->stat("ctx-1", deadline_in(5s));
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
    auto n = (*c)->get("ctx-1", key.first, key.second, *mr, 100, buf.size() - 100, deadline_in(5s));
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    ASSERT_EQ(*n, bytes.size());
    EXPECT_EQ(std::memcmp(buf.data() + 100, bytes.data(), bytes.size()), 0);
  }
  // Many in flight at once.
  std::vector<std::future<Result<size_t>>> fs;
  for (int i = 0; i < 48; ++i)
    fs.push_back((*c)->get_future("ctx-1", i % 3, i % 4, *mr, size_t(i) * 20000, 20000, deadline_in(5s)));
  for (int i = 0; i < 48; ++i) {
    auto r = fs[i].get();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(std::memcmp(buf.data() + size_t(i) * 20000, stored[{i % 3, i % 4}].data(), *r), 0);
  }
  EXPECT_EQ(*(*c)->list(deadline_in(5s)), (std::vector<std::string>{"ctx-1", "ctx-2"}));
  EXPECT_EQ((*c)->get("ctx-1", 9, 0, *mr, 0, buf.size(), deadline_in(5s)).status().code(), StatusCode::not_found);
  EXPECT_EQ((*c)->get("ctx-1", 0, 0, *mr, 0, 10, deadline_in(5s)).status().code(), StatusCode::out_of_range);
  EXPECT_EQ((*c)->put("../x", 0, 0, test_util::pattern(10, 1), deadline_in(5s)).code(), StatusCode::invalid_argument);
  // Namespaces do not see each other.
  auto other = client(5000ms, "tenant-b");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE((*other)->list(deadline_in(5s))->empty());
  EXPECT_EQ((*other)->stat("ctx-1", deadline_in(5s)).status().code(), StatusCode::not_found);
  ASSERT_TRUE((*c)->remove("ctx-1", deadline_in(5s)).ok());
  EXPECT_EQ((*c)->stat("ctx-1", deadline_in(5s)).status().code(), StatusCode::not_found);
  EXPECT_EQ((*c)->get("ctx-1", 0, 0, *mr, 0, buf.size(), deadline_in(5s)).status().code(), StatusCode::not_found);
  EXPECT_EQ((*c)->remove("ctx-1", deadline_in(5s)).code(), StatusCode::not_found);
  EXPECT_EQ(*(*c)->list(deadline_in(5s)), std::vector<std::string>{"ctx-2"});
}

// Use marks on one Redis server: a hash per namespace raised by a script; the listing
// sums each context's size table. Redis keeps no write versions (written 0).
TEST_F(Redis, UseMarksAndTheUsageListing) {
  auto c = client();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  Client& cl = **c;
  ASSERT_TRUE(cl.put("m.a", 0, 0, test_util::pattern(100, 1), deadline_in(5s)).ok());
  ASSERT_TRUE(cl.put("m.a", 0, 1, test_util::pattern(30, 2), deadline_in(5s)).ok());
  ASSERT_TRUE(cl.put("m.a", 1, 0, test_util::pattern(40, 3), deadline_in(5s)).ok());
  ASSERT_TRUE(cl.put("m.b", 0, 0, test_util::pattern(10, 4), deadline_in(5s)).ok());
  ASSERT_TRUE(cl.put("x.c", 2, 0, test_util::pattern(5, 5), deadline_in(5s)).ok());
  const std::vector<storage::ContextTouch> first = {{"m.a", 0}, {"m.b", 1}, {"m.none", 2}};
  ASSERT_TRUE(cl.touch(first, 1000, deadline_in(5s)).ok());
  const std::vector<storage::ContextTouch> lower = {{"m.a", 7}};
  ASSERT_TRUE(cl.touch(lower, 999, deadline_in(5s)).ok());
  const std::vector<storage::ContextTouch> same = {{"m.b", 4}};
  ASSERT_TRUE(cl.touch(same, 1000, deadline_in(5s)).ok());
  auto u = cl.usage("m.", deadline_in(5s));
  ASSERT_TRUE(u.ok()) << u.status().to_string();
  ASSERT_EQ(u->size(), 2u) << "a touch made a context, or the prefix let another through";
  EXPECT_EQ((*u)[0], (storage::ContextUsage{"m.a", 170, {0, 1}, 0, 1000, 0}));
  EXPECT_EQ((*u)[1], (storage::ContextUsage{"m.b", 10, {0}, 0, 1000, 4}));
  auto all = cl.usage("", deadline_in(5s));
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[2], (storage::ContextUsage{"x.c", 5, {2}, 0, 0, 0}));
  // A remove takes the mark with it; the context stored again starts unmarked.
  ASSERT_TRUE(cl.remove("m.a", deadline_in(5s)).ok());
  ASSERT_TRUE(cl.put("m.a", 0, 0, test_util::pattern(100, 1), deadline_in(5s)).ok());
  u = cl.usage("m.a", deadline_in(5s));
  ASSERT_TRUE(u.ok());
  EXPECT_EQ((*u)[0].used, 0u);
  // Other namespaces see none of it.
  auto other = client(5000ms, "tenant-b");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE((*other)->usage("", deadline_in(5s))->empty());
}

// A Redis at its maxmemory that evicts nothing refuses writes ("OOM command not
// allowed"): a put is no_space (only removing data helps), not unavailable, and after
// a remove it fits again.
TEST_F(Redis, APutPastMaxmemoryIsNoSpace) {
  test_util::RedisServer small("kvstream-redis-full", {"--maxmemory", "4mb", "--maxmemory-policy", "noeviction"});
  ASSERT_TRUE(small.started());
  auto c = small.client(5000ms, "tenant-a");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  Status s;
  uint32_t stored = 0;
  for (; stored < 64; ++stored) {
    s = (*c)->put("ctx", stored, 0, test_util::pattern(256 << 10, uint8_t(stored)), deadline_in(5s));
    if (!s.ok()) break;
  }
  ASSERT_EQ(s.code(), StatusCode::no_space) << s.to_string();
  EXPECT_NE(s.message().find("OOM"), std::string::npos) << s.message();
  EXPECT_GT(stored, 0u);
  ASSERT_TRUE((*c)->remove("ctx", deadline_in(5s)).ok());
  EXPECT_TRUE((*c)->put("ctx", 0, 0, test_util::pattern(256 << 10, 1), deadline_in(5s)).ok());
}

// Values pass through hiredis' host buffers: the client says so, and refuses device
// memory loudly instead of registering it as host memory.
TEST_F(Redis, ReportsHostMemoryOnly) {
  auto c = client();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const transport::Capabilities* caps = (*c)->capabilities();
  ASSERT_NE(caps, nullptr);
  EXPECT_EQ(caps->backend, "redis");
  EXPECT_TRUE(caps->host_memory);
  EXPECT_FALSE(caps->cuda_memory);
  std::vector<std::byte> buf(256);
  EXPECT_TRUE((*c)->register_memory(buf.data(), buf.size(), transport::MemoryType::host).ok());
  auto cuda = (*c)->register_memory(buf.data(), buf.size(), transport::MemoryType::cuda);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), StatusCode::unsupported) << cuda.status().to_string();
}

TEST_F(Redis, SameBytesAsTheNativeNode) {
  if (available_backends().empty()) GTEST_SKIP() << "no transport backend built in";
  const fs::path node_dir = dir_ / "native";
  ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.directory = node_dir.string();
  sc.secrets = {{"tenant-a", "0123456789abcdef-tenant-a"}};
  auto server = Server::start(sc);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  ClientConfig cc;
  cc.address = (*server)->address();
  cc.name_space = "tenant-a";
  cc.secret = "0123456789abcdef-tenant-a";
  auto native = Client::connect(cc, deadline_in(5s));
  ASSERT_TRUE(native.ok()) << native.status().to_string();
  auto red = client();
  ASSERT_TRUE(red.ok()) << red.status().to_string();
  for (uint32_t chunk = 0; chunk < 8; ++chunk)
    for (uint32_t level = 0; level < 3; ++level) {
      const auto b = test_util::pattern(3000 + chunk * 50000 + level * 999, 100 + chunk * 3 + level);
      // Level 1 is layered: two parts.
      const std::vector<ObjectPart> parts = level == 1
                                                ? std::vector<ObjectPart>{{b.size() / 3, 0.5 + chunk}, {b.size(), 0.25}}
                                                : std::vector<ObjectPart>{};
      ASSERT_TRUE((*native)->put_parts("same", chunk, level, b, parts, 0, deadline_in(5s)).ok());
      ASSERT_TRUE((*red)->put_parts("same", chunk, level, b, parts, 0, deadline_in(5s)).ok());
    }
  // The same sizes and parts; the node also says each level's write version, Redis none.
  auto native_stat = *(*native)->stat("same", deadline_in(5s));
  for (ChunkStat& st : native_stat) {
    EXPECT_EQ(st.level_versions.size(), st.level_bytes.size());
    st.level_versions.clear();
  }
  EXPECT_EQ(native_stat, *(*red)->stat("same", deadline_in(5s)));
  EXPECT_EQ((*(*red)->stat("same", deadline_in(5s)))[2].level_parts.size(), 2u);
  std::vector<std::byte> a(1 << 20), b(1 << 20);
  auto ma = (*native)->register_memory(a.data(), a.size());
  auto mb = (*red)->register_memory(b.data(), b.size());
  for (uint32_t chunk = 0; chunk < 8; ++chunk)
    for (uint32_t level = 0; level < 3; ++level) {
      auto na = (*native)->get("same", chunk, level, *ma, 0, a.size(), deadline_in(5s));
      auto nb = (*red)->get("same", chunk, level, *mb, 0, b.size(), deadline_in(5s));
      ASSERT_TRUE(na.ok() && nb.ok()) << na.status().to_string() << " / " << nb.status().to_string();
      ASSERT_EQ(*na, *nb);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), *na), 0) << chunk << "/" << level;
      // And the same ranges: a middle one and the last byte.
      const uint64_t size = *na, off = size / 3, len = size / 2;
      for (const auto& [o, l] : std::vector<std::pair<uint64_t, uint64_t>>{{off, len}, {size - 1, 1}}) {
        auto ra = (*native)->get_range("same", chunk, level, o, l, *ma, 0, deadline_in(5s));
        auto rb = (*red)->get_range("same", chunk, level, o, l, *mb, 0, deadline_in(5s));
        ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status().to_string() << " / " << rb.status().to_string();
        EXPECT_EQ(std::memcmp(a.data(), b.data(), l), 0) << chunk << "/" << level << " " << o << "+" << l;
      }
    }
}

// Path of redis-cli, or "" where it is not installed.
std::string redis_cli() {
  for (const char* d : {"/usr/bin/", "/usr/local/bin/"})
    if (fs::exists(std::string(d) + "redis-cli")) return std::string(d) + "redis-cli";
  return {};
}

TEST_F(Redis, CorruptValueIsDetected) {
  const std::string cli = redis_cli();
  if (cli.empty()) GTEST_SKIP() << "redis-cli is not installed (Debian package redis-tools)";
  auto c = client();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->put("bad", 0, 0, test_util::pattern(5000, 1), deadline_in(5s)).ok());
  const std::string cmd = fmt::format("{} -p {} SETRANGE kvs:tenant-a:bad:0:0 100 Z > /dev/null", cli, port_);
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::vector<std::byte> buf(10000);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  EXPECT_EQ((*c)->get("bad", 0, 0, *mr, 0, buf.size(), deadline_in(5s)).status().code(), StatusCode::corrupt_data);
}

// A value's checksum binds its key: copied to another chunk's key it is refused, not
// served as that chunk.
TEST_F(Redis, ValueCopiedToAnotherKeyIsRefused) {
  const std::string cli = redis_cli();
  if (cli.empty()) GTEST_SKIP() << "redis-cli is not installed (Debian package redis-tools)";
  auto c = client();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->put("moved", 10, 0, test_util::pattern(5000, 1), deadline_in(5s)).ok());
  const std::string cmd =
      fmt::format("{} -p {} COPY kvs:tenant-a:moved:10:0 kvs:tenant-a:moved:11:0 > /dev/null", cli, port_);
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::vector<std::byte> buf(10000);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  EXPECT_TRUE((*c)->get("moved", 10, 0, *mr, 0, buf.size(), deadline_in(5s)).ok());
  EXPECT_EQ((*c)->get("moved", 11, 0, *mr, 0, buf.size(), deadline_in(5s)).status().code(), StatusCode::corrupt_data);
}

// Parts are stored with the value (one MULTI/EXEC) and come back from stat; a put
// without parts clears them; ranges read the slices, across 64 KiB blocks, and a range
// past the end writes nothing. Removing the context leaves no key behind.
TEST_F(Redis, PartsAndRanges) {
  auto c = client();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const uint64_t size = (1 << 20) + 4321;
  const auto obj = test_util::pattern(size, 3), small = test_util::pattern(1000, 4);
  const std::vector<ObjectPart> parts = {{65536, 3.0}, {300000, 1.5}, {size, 0.0}};
  ASSERT_TRUE((*c)->put_parts("layers", 2, 0, obj, parts, 0, deadline_in(5s)).ok());
  ASSERT_TRUE((*c)->put("layers", 2, 1, small, deadline_in(5s)).ok());
  ASSERT_TRUE(
      (*c)->put_parts("layers", 2, 3, small, std::vector<ObjectPart>{{10, 1}, {1000, 0}}, 0, deadline_in(5s)).ok());
  EXPECT_EQ(
      (*c)->put_parts("layers", 2, 4, small, std::vector<ObjectPart>{{10, 1}, {999, 0}}, 0, deadline_in(5s)).code(),
      StatusCode::invalid_argument);
  auto st = (*c)->stat("layers", deadline_in(5s));
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  const std::vector<ChunkStat> want = {
      {2, {size, small.size(), 0, small.size()}, {parts, {}, {}, {{10, 1}, {1000, 0}}}}};
  EXPECT_EQ(*st, want);
  ASSERT_TRUE((*c)->put("layers", 2, 3, small, deadline_in(5s)).ok());
  EXPECT_EQ((*(*c)->stat("layers", deadline_in(5s)))[0].level_parts, (std::vector<std::vector<ObjectPart>>{parts}));

  const size_t at = 99;
  std::vector<std::byte> buf(size + 2 * at);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  ASSERT_TRUE(mr.ok());
  for (const auto& [offset, length] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 1}, {size - 1, 1}, {0, size}, {65536 - 10, 20}, {65536, 65536}, {100000, 700001}}) {
    std::fill(buf.begin(), buf.end(), std::byte{0xee});
    auto n = (*c)->get_range("layers", 2, 0, offset, length, *mr, at, deadline_in(5s));
    ASSERT_TRUE(n.ok()) << offset << "+" << length << ": " << n.status().to_string();
    EXPECT_EQ(*n, length);
    EXPECT_EQ(std::memcmp(buf.data() + at, obj.data() + offset, length), 0) << offset << "+" << length;
    EXPECT_TRUE(std::all_of(buf.begin(), buf.begin() + at, [](std::byte b) { return b == std::byte{0xee}; }));
    EXPECT_TRUE(
        std::all_of(buf.begin() + long(at + length), buf.end(), [](std::byte b) { return b == std::byte{0xee}; }));
  }
  std::fill(buf.begin(), buf.end(), std::byte{0x5c});
  for (const auto& [offset, length] :
       std::vector<std::pair<uint64_t, uint64_t>>{{size - 10, 11}, {size, 1}, {size + 5, 1}})
    EXPECT_EQ((*c)->get_range("layers", 2, 0, offset, length, *mr, 0, deadline_in(5s)).status().code(),
              StatusCode::out_of_range);
  EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{0x5c}; }));
  EXPECT_EQ((*c)->get_range("layers", 2, 2, 0, 1, *mr, 0, deadline_in(5s)).status().code(), StatusCode::not_found);
  EXPECT_EQ((*c)->get_range("layers", 2, 0, 0, 0, *mr, 0, deadline_in(5s)).status().code(),
            StatusCode::invalid_argument);
  ASSERT_TRUE((*c)->remove("layers", deadline_in(5s)).ok());
  EXPECT_EQ((*c)->get_range("layers", 2, 0, 0, 1, *mr, 0, deadline_in(5s)).status().code(), StatusCode::not_found);
  const std::string cli = redis_cli();
  if (cli.empty()) return;
  const std::string out = (dir_ / "dbsize.txt").string();
  ASSERT_EQ(std::system(fmt::format("{} -p {} DBSIZE > {}", cli, port_, out).c_str()), 0);
  std::ifstream in(out);
  int keys = -1;
  in >> keys;
  EXPECT_EQ(keys, 0) << "remove left keys behind";
}

// Each block a range touches is verified: damage inside the range is corrupt_data,
// and nothing is written; a range of intact blocks still reads. A value stored without
// block sums (by a client before range reads) is read whole and verified instead.
TEST_F(Redis, RangeOfADamagedValueIsRefused) {
  const std::string cli = redis_cli();
  if (cli.empty()) GTEST_SKIP() << "redis-cli is not installed (Debian package redis-tools)";
  auto c = client();
  ASSERT_TRUE(c.ok());
  const uint64_t size = 300000;
  const auto obj = test_util::pattern(size, 8);
  ASSERT_TRUE((*c)->put("bad", 0, 0, obj, deadline_in(5s)).ok());
  ASSERT_TRUE((*c)->put("bad", 1, 0, obj, deadline_in(5s)).ok());
  // Payload byte 200000 (block 3) of chunk 0: the value's 8-byte checksum comes first.
  auto redis = [&](const std::string& args) {
    return std::system(fmt::format("{} -p {} {} > /dev/null", cli, port_, args).c_str());
  };
  ASSERT_EQ(redis("SETRANGE kvs:tenant-a:bad:0:0 200008 Z"), 0);
  std::vector<std::byte> buf(size, std::byte{0x11});
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  EXPECT_EQ((*c)->get_range("bad", 0, 0, 199990, 20, *mr, 0, deadline_in(5s)).status().code(),
            StatusCode::corrupt_data);
  EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{0x11}; }));
  auto intact = (*c)->get_range("bad", 0, 0, 0, 100000, *mr, 0, deadline_in(5s));
  ASSERT_TRUE(intact.ok()) << intact.status().to_string();
  EXPECT_EQ(std::memcmp(buf.data(), obj.data(), 100000), 0);
  // Without its block sums the whole value is verified.
  ASSERT_EQ(redis("DEL kvs:tenant-a:bad:0:0:blocks kvs:tenant-a:bad:1:0:blocks"), 0);
  EXPECT_EQ((*c)->get_range("bad", 0, 0, 0, 10, *mr, 0, deadline_in(5s)).status().code(), StatusCode::corrupt_data);
  auto whole = (*c)->get_range("bad", 1, 0, 1000, 5000, *mr, 0, deadline_in(5s));
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_EQ(std::memcmp(buf.data(), obj.data() + 1000, 5000), 0);
  EXPECT_EQ((*c)->get_range("bad", 1, 0, size, 1, *mr, 0, deadline_in(5s)).status().code(), StatusCode::out_of_range);
  // Block sums copied with a value to another key fail there too.
  ASSERT_TRUE((*c)->put("bad", 2, 0, obj, deadline_in(5s)).ok());
  ASSERT_EQ(redis("COPY kvs:tenant-a:bad:2:0 kvs:tenant-a:bad:3:0"), 0);
  ASSERT_EQ(redis("COPY kvs:tenant-a:bad:2:0:blocks kvs:tenant-a:bad:3:0:blocks"), 0);
  EXPECT_EQ((*c)->get_range("bad", 3, 0, 0, 10, *mr, 0, deadline_in(5s)).status().code(), StatusCode::corrupt_data);
}

TEST_F(Redis, DeadlineAndCancelEvenWhenTheServerStalls) {
  auto c = client();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->put("x", 0, 0, test_util::pattern(1000, 1), deadline_in(5s)).ok());
  std::vector<std::byte> buf(1000);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  EXPECT_EQ((*c)->get("x", 0, 0, *mr, 0, 1000, Clock::now() - 1ms).status().code(), StatusCode::timed_out);
  CancelToken cancel;
  cancel.cancel();
  EXPECT_EQ((*c)->get("x", 0, 0, *mr, 0, 1000, deadline_in(5s), cancel).status().code(), StatusCode::cancelled);
  // The server stops answering (SIGSTOP): a get ends at its deadline; a cancel ends
  // another one promptly.
  // The codes say what ended each call: the deadline (timed_out) or the cancel (with
  // the deadline a minute away); how soon is the machine's and not asserted.
  ::kill(pid_, SIGSTOP);
  EXPECT_EQ((*c)->get("x", 0, 0, *mr, 0, 1000, deadline_in(300ms)).status().code(), StatusCode::timed_out);
  CancelToken later;
  auto f = (*c)->get_future("x", 0, 0, *mr, 0, 1000, deadline_in(60s), later);
  std::this_thread::sleep_for(100ms);  // likely in flight by then; a cancel before that ends it the same way
  later.cancel();
  EXPECT_EQ(f.get().status().code(), StatusCode::cancelled);
  EXPECT_EQ((*c)->stat("x", deadline_in(200ms)).status().code(), StatusCode::timed_out);
  ::kill(pid_, SIGCONT);
  // The client keeps working once the server is back (connections are reopened).
  auto r = (*c)->get("x", 0, 0, *mr, 0, 1000, deadline_in(8s));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::memcmp(buf.data(), test_util::pattern(1000, 1).data(), 1000), 0);
}

}  // namespace

}  // namespace kvstream::test_redis

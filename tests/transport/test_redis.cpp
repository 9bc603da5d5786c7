// The Redis storage client against a redis-server started per test on a free port in
// a temporary directory (skipped when redis-server is not installed or kvstream was
// built without hiredis).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "kvstream/redis_storage.hpp"
#include "kvstream/storage.hpp"
#include "tests/transport/transport_test_util.hpp"
#include "tests/transport/redis_server.hpp"

using namespace kvstream;
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
      ASSERT_TRUE((*native)->put("same", chunk, level, b, deadline_in(5s)).ok());
      ASSERT_TRUE((*red)->put("same", chunk, level, b, deadline_in(5s)).ok());
    }
  EXPECT_EQ(*(*native)->stat("same", deadline_in(5s)), *(*red)->stat("same", deadline_in(5s)));
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
  ::kill(pid_, SIGSTOP);
  auto t0 = Clock::now();
  EXPECT_EQ((*c)->get("x", 0, 0, *mr, 0, 1000, deadline_in(300ms)).status().code(), StatusCode::timed_out);
  EXPECT_LT(Clock::now() - t0, 600ms);
  CancelToken later;
  auto f = (*c)->get_future("x", 0, 0, *mr, 0, 1000, deadline_in(5s), later);
  std::this_thread::sleep_for(100ms);
  t0 = Clock::now();
  later.cancel();
  EXPECT_EQ(f.get().status().code(), StatusCode::cancelled);
  EXPECT_LT(Clock::now() - t0, 200ms);
  EXPECT_EQ((*c)->stat("x", deadline_in(200ms)).status().code(), StatusCode::timed_out);
  ::kill(pid_, SIGCONT);
  // The client keeps working once the server is back (connections are reopened).
  auto r = (*c)->get("x", 0, 0, *mr, 0, 1000, deadline_in(8s));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::memcmp(buf.data(), test_util::pattern(1000, 1).data(), 1000), 0);
}

}  // namespace

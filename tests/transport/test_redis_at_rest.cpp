// Encryption at rest of the values the Redis client stores (RedisConfig::at_rest):
// round trips, what Redis holds, and what is refused (a value moved to another key,
// changed bytes, a cut value, a key id the key file no longer has). redis-server on a
// free port per test; the stored bytes are read and damaged with redis-cli. Skipped
// when redis-server or redis-cli is missing or kvstream was built without hiredis.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "kvstream/redis_storage.hpp"
#include "kvstream/storage.hpp"
#include "tests/transport/redis_cluster.hpp"
#include "tests/transport/redis_server.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::test_redis_at_rest {

using namespace kvstream::storage;
using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kStride = 65536 + 16;  // a sealed block and its tag
constexpr uint64_t kHeader = 24;          // magic, key id, nonce

class RedisAtRest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = test_util::RedisCluster::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    redis_ = std::make_unique<test_util::RedisServer>("kvstream-redis-at-rest");
    ASSERT_TRUE(redis_->started()) << "see " << (redis_->dir() / "redis.log");
    keys_ = (redis_->dir() / "keys").string();
    write_keys({1});
  }
  void TearDown() override { redis_.reset(); }

  // A key file with master keys `ids` (each id's key is the same across calls).
  void write_keys(const std::vector<uint32_t>& ids) {
    std::ofstream f(keys_, std::ios::trunc);
    f << "# test keys\n";
    for (uint32_t id : ids) {
      std::mt19937_64 rng(id * 7919 + 17);
      f << id << ' ';
      for (int i = 0; i < 4; ++i) f << fmt::format("{:016x}", rng());
      f << '\n';
    }
    f.close();
    ::chmod(keys_.c_str(), 0600);
  }
  Result<std::unique_ptr<Client>> client(bool sealed = true, const std::string& ns = "tenant-a",
                                         bool read_clear = true) {
    redis::RedisConfig cfg;
    cfg.address = redis_->address();
    cfg.name_space = ns;
    if (sealed) cfg.at_rest.key_file = keys_;
    cfg.read_clear_values = read_clear;
    return redis::connect(cfg, deadline_in(5s));
  }
  // redis-cli's output (raw bytes, then a newline) for one command.
  std::string cli(std::vector<std::string> args) const {
    args.insert(args.begin(), {"-p", std::to_string(redis_->port())});
    return test_util::RedisCluster::cli(args);
  }
  // Flips the low bit of byte `at` of `key`'s value.
  void flip(const std::string& key, uint64_t at) const {
    cli({"EVAL",
         "local v = redis.call('GETRANGE', KEYS[1], ARGV[1], ARGV[1]) "
         "redis.call('SETRANGE', KEYS[1], ARGV[1], string.char(bit.bxor(string.byte(v), 1))) return 1",
         "1", key, std::to_string(at)});
  }
  // Status of a whole get of `chunk` (level 0 of "ctx") into `buf`, which is left as it
  // was when the get fails.
  StatusCode get_code(Client& c, uint32_t chunk, std::vector<std::byte>& buf) {
    auto mr = c.register_memory(buf.data(), buf.size());
    return c.get("ctx", chunk, 0, *mr, 0, buf.size(), deadline_in(5s)).status().code();
  }
  StatusCode range_code(Client& c, uint32_t chunk, uint64_t offset, uint64_t length, std::vector<std::byte>& buf) {
    auto mr = c.register_memory(buf.data(), buf.size());
    return c.get_range("ctx", chunk, 0, offset, length, *mr, 0, deadline_in(5s)).status().code();
  }

  std::unique_ptr<test_util::RedisServer> redis_;
  std::string keys_;
};

std::string key_of(uint32_t chunk, const std::string& ns = "tenant-a") {
  return fmt::format("kvs:{}:ctx:{}:0", ns, chunk);
}

// Sealed values read back whole and by range (within a block, across blocks, the
// last partial block), empty ones too; stat reports the payload sizes and parts;
// remove leaves nothing behind.
TEST_F(RedisAtRest, RoundTripRangesAndStat) {
  auto c = client();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const uint64_t size = (1 << 20) + 4321;
  const auto obj = test_util::pattern(size, 3), small = test_util::pattern(1000, 4);
  const std::vector<ObjectPart> parts = {{65536, 3.0}, {size, 0.0}};
  ASSERT_TRUE((*c)->put_parts("ctx", 0, 0, obj, parts, 0, deadline_in(5s)).ok());
  ASSERT_TRUE((*c)->put("ctx", 1, 0, small, deadline_in(5s)).ok());
  ASSERT_TRUE((*c)->put("ctx", 2, 0, {}, deadline_in(5s)).ok());
  std::vector<std::byte> buf(size);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  auto n = (*c)->get("ctx", 0, 0, *mr, 0, size, deadline_in(5s));
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(buf, obj);
  n = (*c)->get("ctx", 1, 0, *mr, 0, size, deadline_in(5s));
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(std::vector<std::byte>(buf.begin(), buf.begin() + long(*n)), small);
  n = (*c)->get("ctx", 2, 0, *mr, 0, size, deadline_in(5s));
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(*n, 0u);
  for (const auto& [offset, length] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 1}, {size - 1, 1}, {0, size}, {65536 - 10, 20}, {65536, 65536}, {100000, 700001}, {size - 5000, 5000}}) {
    std::fill(buf.begin(), buf.end(), std::byte{0xee});
    auto r = (*c)->get_range("ctx", 0, 0, offset, length, *mr, 0, deadline_in(5s));
    ASSERT_TRUE(r.ok()) << offset << "+" << length << ": " << r.status().to_string();
    EXPECT_EQ(std::memcmp(buf.data(), obj.data() + offset, length), 0) << offset << "+" << length;
  }
  EXPECT_EQ(range_code(**c, 0, size - 10, 11, buf), StatusCode::out_of_range);
  EXPECT_EQ(range_code(**c, 2, 0, 1, buf), StatusCode::out_of_range);
  EXPECT_EQ(range_code(**c, 7, 0, 1, buf), StatusCode::not_found);
  auto st = (*c)->stat("ctx", deadline_in(5s));
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  ASSERT_EQ(st->size(), 3u);
  EXPECT_EQ((*st)[0].level_bytes, std::vector<uint64_t>{size});
  EXPECT_EQ((*st)[0].level_parts, std::vector<std::vector<ObjectPart>>{parts});
  EXPECT_EQ((*st)[1].level_bytes, std::vector<uint64_t>{small.size()});
  ASSERT_TRUE((*c)->remove("ctx", deadline_in(5s)).ok());
  EXPECT_EQ(std::atoi(cli({"DBSIZE"}).c_str()), 0);
}

// What Redis holds is the sealed layout: no plaintext, no block sums of it, the
// length of header, payload and one tag per 64 KiB.
TEST_F(RedisAtRest, StoredValueHoldsNoPlaintext) {
  std::string text;
  while (text.size() < 200000) text += "kvstream plaintext marker 0123456789; ";
  const auto bytes = std::as_bytes(std::span(text.data(), text.size()));
  auto sealed = client(), clear = client(false);
  ASSERT_TRUE(sealed.ok() && clear.ok());
  ASSERT_TRUE((*sealed)->put("ctx", 0, 0, bytes, deadline_in(5s)).ok());
  ASSERT_TRUE((*clear)->put("ctx", 1, 0, bytes, deadline_in(5s)).ok());
  const std::string raw = cli({"GET", key_of(0)}), raw_clear = cli({"GET", key_of(1)});
  EXPECT_NE(raw_clear.find("plaintext marker"), std::string::npos);  // the check can see it
  EXPECT_EQ(raw.find("plaintext marker"), std::string::npos);
  EXPECT_EQ(raw.substr(0, 7), "kvsAEv1");
  const uint64_t blocks = (text.size() + 65535) / 65536;
  EXPECT_EQ(std::stoull(cli({"STRLEN", key_of(0)})), kHeader + text.size() + 16 * blocks);
  EXPECT_EQ(cli({"EXISTS", key_of(0) + ":blocks"}), "0\n");
  EXPECT_EQ(cli({"EXISTS", key_of(1) + ":blocks"}), "1\n");
  // Two puts of the same bytes are sealed under different nonces.
  ASSERT_TRUE((*sealed)->put("ctx", 2, 0, bytes, deadline_in(5s)).ok());
  EXPECT_NE(cli({"GETRANGE", key_of(0), "12", "100"}), cli({"GETRANGE", key_of(2), "12", "100"}));
}

// A sealed value is bound to its key: copied over another chunk's key, or another
// namespace's, it fails authentication there (and the original still reads).
TEST_F(RedisAtRest, ValueCopiedToAnotherKeyIsRefused) {
  auto a = client(), b = client(true, "tenant-b");
  ASSERT_TRUE(a.ok() && b.ok());
  const auto v = test_util::pattern(100000, 5);
  ASSERT_TRUE((*a)->put("ctx", 10, 0, v, deadline_in(5s)).ok());
  ASSERT_TRUE((*a)->put("ctx", 11, 0, v, deadline_in(5s)).ok());
  ASSERT_TRUE((*b)->put("ctx", 10, 0, v, deadline_in(5s)).ok());
  cli({"COPY", key_of(10), key_of(11), "REPLACE"});
  cli({"COPY", key_of(10), key_of(10, "tenant-b"), "REPLACE"});
  std::vector<std::byte> buf(v.size(), std::byte{0x42});
  EXPECT_EQ(get_code(**a, 11, buf), StatusCode::corrupt_data);
  EXPECT_EQ(range_code(**a, 11, 70000, 10, buf), StatusCode::corrupt_data);
  EXPECT_EQ(get_code(**b, 10, buf), StatusCode::corrupt_data);
  EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](std::byte x) { return x == std::byte{0x42}; }));
  EXPECT_EQ(get_code(**a, 10, buf), StatusCode::ok);
  EXPECT_EQ(buf, v);
}

// One flipped bit anywhere (ciphertext, tag, nonce) is corrupt_data and nothing is
// delivered; a range of untouched blocks still reads. A value cut at a block boundary
// fails too (its size is bound), and a key id changed to one the file lacks is
// permission_denied.
TEST_F(RedisAtRest, DamageIsDetected) {
  auto c = client();
  ASSERT_TRUE(c.ok());
  const uint64_t size = 300000;  // 5 blocks
  const auto v = test_util::pattern(size, 8);
  for (uint32_t chunk = 0; chunk < 5; ++chunk) ASSERT_TRUE((*c)->put("ctx", chunk, 0, v, deadline_in(5s)).ok());
  flip(key_of(0), kHeader + 3 * kStride + 100);  // block 3's ciphertext
  flip(key_of(1), kHeader + kStride - 1);        // block 0's tag
  flip(key_of(2), 14);                           // the nonce
  cli({"EVAL", "redis.call('SET', KEYS[1], string.sub(redis.call('GET', KEYS[1]), 1, tonumber(ARGV[1]))) return 1",
       "1", key_of(3), std::to_string(kHeader + 4 * kStride)});  // the last block gone
  flip(key_of(4), 9);                            // the key id: 1 becomes 257
  std::vector<std::byte> buf(size, std::byte{0x11});
  for (uint32_t chunk = 0; chunk < 4; ++chunk) EXPECT_EQ(get_code(**c, chunk, buf), StatusCode::corrupt_data) << chunk;
  EXPECT_EQ(get_code(**c, 4, buf), StatusCode::permission_denied);
  EXPECT_EQ(range_code(**c, 0, 3 * 65536 + 50, 100, buf), StatusCode::corrupt_data);
  EXPECT_EQ(range_code(**c, 1, 10, 10, buf), StatusCode::corrupt_data);
  EXPECT_EQ(range_code(**c, 3, 0, 10, buf), StatusCode::corrupt_data);
  EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](std::byte x) { return x == std::byte{0x11}; }));
  ASSERT_EQ(range_code(**c, 0, 1000, 2 * 65536, buf), StatusCode::ok);  // blocks 0..2 are intact
  EXPECT_EQ(std::memcmp(buf.data(), v.data() + 1000, 2 * 65536), 0);
}

// Rotation: a key appended to the file seals new values; values under the old key
// still read; a client whose file lost the old key refuses those (permission_denied:
// not corrupt, just not readable here).
TEST_F(RedisAtRest, OldKeyIdsStayReadableAfterRotation) {
  const auto v1 = test_util::pattern(70000, 1), v2 = test_util::pattern(70000, 2);
  {
    auto c = client();
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->put("ctx", 1, 0, v1, deadline_in(5s)).ok());
  }
  write_keys({1, 2});
  auto c = client();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->put("ctx", 2, 0, v2, deadline_in(5s)).ok());
  EXPECT_EQ(cli({"GETRANGE", key_of(1), "8", "11"}), std::string("\x01\0\0\0\n", 5));
  EXPECT_EQ(cli({"GETRANGE", key_of(2), "8", "11"}), std::string("\x02\0\0\0\n", 5));
  std::vector<std::byte> buf(70000);
  ASSERT_EQ(get_code(**c, 1, buf), StatusCode::ok);
  EXPECT_EQ(buf, v1);
  ASSERT_EQ(range_code(**c, 1, 60000, 10000, buf), StatusCode::ok);
  EXPECT_EQ(std::memcmp(buf.data(), v1.data() + 60000, 10000), 0);
  ASSERT_EQ(get_code(**c, 2, buf), StatusCode::ok);
  EXPECT_EQ(buf, v2);
  write_keys({2});
  auto retired = client();
  ASSERT_TRUE(retired.ok());
  EXPECT_EQ(get_code(**retired, 1, buf), StatusCode::permission_denied);
  EXPECT_EQ(get_code(**retired, 2, buf), StatusCode::ok);
}

// Values stored before encryption was turned on stay readable (whole and by range)
// unless read_clear_values is false; a client without the key file cannot read a
// sealed value; a key file that does not exist fails the connect.
TEST_F(RedisAtRest, ClearAndSealedValuesSideBySide) {
  const auto v = test_util::pattern(200000, 9);
  auto clear = client(false), sealed = client(), strict = client(true, "tenant-a", false);
  ASSERT_TRUE(clear.ok() && sealed.ok() && strict.ok());
  ASSERT_TRUE((*clear)->put("ctx", 0, 0, v, deadline_in(5s)).ok());
  ASSERT_TRUE((*sealed)->put("ctx", 1, 0, v, deadline_in(5s)).ok());
  std::vector<std::byte> buf(v.size());
  ASSERT_EQ(get_code(**sealed, 0, buf), StatusCode::ok);
  EXPECT_EQ(buf, v);
  ASSERT_EQ(range_code(**sealed, 0, 70000, 70000, buf), StatusCode::ok);
  EXPECT_EQ(std::memcmp(buf.data(), v.data() + 70000, 70000), 0);
  EXPECT_EQ(get_code(**strict, 0, buf), StatusCode::corrupt_data);
  EXPECT_EQ(range_code(**strict, 0, 0, 10, buf), StatusCode::corrupt_data);
  EXPECT_EQ(get_code(**strict, 1, buf), StatusCode::ok);
  EXPECT_EQ(get_code(**clear, 1, buf), StatusCode::permission_denied);
  EXPECT_EQ(range_code(**clear, 1, 0, 10, buf), StatusCode::permission_denied);
  keys_ = (redis_->dir() / "no-such-file").string();
  EXPECT_EQ(client().status().code(), StatusCode::not_found);
}

}  // namespace

}  // namespace kvstream::test_redis_at_rest

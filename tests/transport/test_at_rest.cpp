// Encryption at rest in the storage node (format 4): objects round-trip sealed and no
// plaintext reaches the disk; a changed ciphertext byte, a file copied to another
// object's name (its xxh3 binding recomputed) and a missing key are each refused, the
// first two moved aside, the last not; ranges decrypt only the blocks they cover, at
// every boundary; rotation keeps old objects readable until the background pass moves
// them to the new key, and that pass never undoes a newer write.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "kvstream/storage.hpp"
#include "security/key_ring.hpp"
#include "storage/node/chunk_store.hpp"
#include "storage/protocol.hpp"
#include "tests/transport/node_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::test_at_rest {

using namespace kvstream::storage;
using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string kSecret = "0123456789abcdef-tenant-a";
using transport::test_util::pattern;
namespace node_util = kvstream::storage::node_test_util;
using node_util::TempDir;

constexpr size_t kBlock = 64 << 10;

std::string random_hex_key() {
  std::random_device rd;
  std::string hex;
  for (int i = 0; i < 32; ++i) hex += fmt::format("{:02x}", rd() & 0xff);
  return hex;
}

std::vector<std::byte> file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(raw.size());
  std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

void write_file(const fs::path& p, std::span<const std::byte> bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

template <typename T>
T get_at(std::span<const std::byte> b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}

// The header's format and, for format 4, the id of the key it is sealed under.
std::pair<uint16_t, uint32_t> format_and_key(const fs::path& p) {
  const auto b = file_bytes(p);
  if (b.size() < 80) return {0, 0};
  const auto format = get_at<uint16_t>(b, 4);
  return {format, format == 4 ? get_at<uint32_t>(b, 24) : 0};
}

// True when `needle` (at least 64 bytes of it) occurs in `hay`.
bool contains(std::span<const std::byte> hay, std::span<const std::byte> needle) {
  needle = needle.first(std::min<size_t>(needle.size(), 64));
  return std::search(hay.begin(), hay.end(), needle.begin(), needle.end()) != hay.end();
}

class AtRest : public ::testing::Test {
 protected:
  AtRest() { keys_[1] = random_hex_key(); }

  // Writes the key file with the keys in keys_ (owner-only, as an operator would).
  void write_keys() {
    std::ofstream f(key_file_, std::ios::trunc);
    f << "# test keys\n";
    for (const auto& [id, hex] : keys_) f << id << " " << hex << "\n";
    f.close();
    fs::permissions(key_file_, fs::perms::owner_read | fs::perms::owner_write);
  }
  ServerConfig config(bool encrypted = true) {
    auto cfg = node_util::node_config(dir_, {{"tenant-a", kSecret}});
    if (encrypted) {
      write_keys();
      cfg.at_rest.key_file = key_file_.string();
    }
    cfg.reencrypt_bytes_per_second = 0;
    return cfg;
  }
  std::unique_ptr<Server> start(const ServerConfig& cfg) {
    auto s = Server::start(cfg);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  std::unique_ptr<Client> client(const std::string& addr) {
    auto c = node_util::connect_client(addr, "tenant-a", kSecret);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  Result<std::vector<std::byte>> fetch(Client& c, const std::string& ctx, uint32_t chunk, size_t cap = 12 << 20) {
    std::vector<std::byte> buf(std::max<size_t>(cap, 1));
    auto mr = c.register_memory(buf.data(), buf.size());
    if (!mr.ok()) return mr.status();
    KVS_ASSIGN_OR_RETURN(size_t n, c.get(ctx, chunk, 0, *mr, 0, cap, deadline_in(30s)));
    buf.resize(n);
    return buf;
  }
  Result<std::vector<std::byte>> fetch_range(Client& c, const std::string& ctx, uint32_t chunk, uint64_t offset,
                                             uint64_t length) {
    std::vector<std::byte> buf(length);
    auto mr = c.register_memory(buf.data(), buf.size());
    if (!mr.ok()) return mr.status();
    KVS_RETURN_IF_ERROR(c.get_range(ctx, chunk, 0, offset, length, *mr, 0, deadline_in(30s)).status());
    return buf;
  }
  fs::path object(const std::string& ctx, uint32_t chunk) const {
    return dir_ / "tenant-a" / ctx / fmt::format("c{}.l0", chunk);
  }
  // Waits until the node has no object under another key than its current one.
  bool settled(Server& s) {
    for (int i = 0; i < 400; ++i) {
      if (s.counters().objects_under_old_keys == 0) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }
  bool quarantine_empty() const { return !fs::exists(dir_ / ".quarantine") || fs::is_empty(dir_ / ".quarantine"); }

  TempDir tmp_{"kvstream-at-rest"}, key_dir_{"kvstream-at-rest-keys"};
  const fs::path& dir_ = tmp_.path();
  fs::path key_file_ = [this] {
    fs::create_directories(key_dir_.path());
    return key_dir_.path() / "keys";
  }();
  std::map<uint32_t, std::string> keys_;
};

// Objects of many sizes round-trip through a node with encryption on; on disk each is
// format 4 under key 1 and holds none of its plaintext; after a restart they still read.
TEST_F(AtRest, RoundTripLeavesNoPlaintextOnDisk) {
  const std::vector<size_t> sizes = {0, 1, 100, kBlock - 1, kBlock, kBlock + 1, 3 * kBlock + 17, (5 << 20) + 3};
  {
    auto s = start(config());
    ASSERT_TRUE(s);
    auto c = client(s->address());
    for (uint32_t i = 0; i < sizes.size(); ++i)
      ASSERT_TRUE(c->put("ctx", i, 0, pattern(sizes[i], i + 1), deadline_in(30s)).ok()) << sizes[i];
    for (uint32_t i = 0; i < sizes.size(); ++i) {
      auto got = fetch(*c, "ctx", i);
      ASSERT_TRUE(got.ok()) << sizes[i] << ": " << got.status().to_string();
      EXPECT_EQ(*got, pattern(sizes[i], i + 1)) << sizes[i];
    }
  }
  for (uint32_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(format_and_key(object("ctx", i)), (std::pair<uint16_t, uint32_t>{4, 1})) << sizes[i];
    if (sizes[i] >= 64) EXPECT_FALSE(contains(file_bytes(object("ctx", i)), pattern(sizes[i], i + 1))) << sizes[i];
    // Each block with its tag, after an 80-byte header.
    EXPECT_EQ(fs::file_size(object("ctx", i)), 80 + sizes[i] + 16 * ((sizes[i] + kBlock - 1) / kBlock)) << sizes[i];
  }
  auto s = start(config());
  ASSERT_TRUE(s);
  auto c = client(s->address());
  for (uint32_t i = 0; i < sizes.size(); ++i) {
    auto got = fetch(*c, "ctx", i);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, pattern(sizes[i], i + 1));
  }
  EXPECT_EQ(s->counters().objects_under_old_keys, 0u);
}

// A changed ciphertext byte fails its block's tag: never delivered (read whole into the
// cache, or streamed), and the object is moved aside and leaves stat.
TEST_F(AtRest, FlippedCiphertextByteIsNeverDelivered) {
  for (const bool streamed : {false, true}) {
    SCOPED_TRACE(streamed ? "streamed" : "read whole");
    auto cfg = config();
    if (streamed) cfg.cache_bytes = 0;
    const std::string ctx = streamed ? "s" : "w";
    const auto body = pattern((3 << 20) + 5, 7);
    {
      auto s = start(cfg);
      ASSERT_TRUE(s);
      auto c = client(s->address());
      ASSERT_TRUE(c->put(ctx, 0, 0, body, deadline_in(30s)).ok());
      ASSERT_TRUE(c->put(ctx, 1, 0, pattern(100, 1), deadline_in(30s)).ok());
    }
    {  // a byte in the middle of block 40 (past the first 2 MiB)
      std::fstream f(object(ctx, 0), std::ios::in | std::ios::out | std::ios::binary);
      const std::streamoff at = 80 + 40 * (kBlock + 16) + 1234;
      f.seekg(at);
      const char was = char(f.get());
      f.seekp(at);
      f.put(char(was ^ 0x01));
    }
    auto s = start(cfg);
    ASSERT_TRUE(s);
    auto c = client(s->address());
    auto got = fetch(*c, ctx, 0);
    EXPECT_FALSE(got.ok()) << "a damaged object was delivered";
    if (!streamed) EXPECT_EQ(got.status().code(), StatusCode::corrupt_data) << got.status().to_string();
    // A range inside the damaged block is refused as well (a new client: a streamed
    // failure ends the connection).
    c = client(s->address());
    auto range = fetch_range(*c, ctx, 0, 40 * kBlock + 100, 5000);
    EXPECT_FALSE(range.ok());
    auto st = c->stat(ctx, deadline_in(10s));
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    ASSERT_EQ(st->size(), 1u) << "the damaged object is still listed";
    EXPECT_EQ((*st)[0].chunk, 1u);
    EXPECT_FALSE(fs::exists(object(ctx, 0))) << "not moved aside";
    EXPECT_FALSE(quarantine_empty());
  }
}

// A sealed file copied to another chunk's name, its xxh3 binding recomputed for that
// name, is refused: the seal of its checksum binds the name.
TEST_F(AtRest, CopyUnderAnotherNameWithItsBindingRecomputedIsRefused) {
  auto s = start(config());
  ASSERT_TRUE(s);
  auto c = client(s->address());
  ASSERT_TRUE(c->put("ctx", 10, 0, pattern(5000, 10), deadline_in(10s)).ok());
  auto bytes = file_bytes(object("ctx", 10));
  const std::string name = "tenant-a/ctx/c11.l0";
  std::vector<std::byte> bound(bytes.begin(), bytes.begin() + 72);
  for (char ch : name) bound.push_back(std::byte(ch));  // no parts table
  const uint64_t binding = body_checksum(bound);
  std::memcpy(bytes.data() + 72, &binding, 8);
  write_file(object("ctx", 11), bytes);
  auto got = fetch(*c, "ctx", 11);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::corrupt_data) << got.status().to_string();
  EXPECT_NE(got.status().message().find("authentication"), std::string::npos) << got.status().message();
  EXPECT_TRUE(fetch(*c, "ctx", 10).ok());
  // And at start: the scan verifies the seal too, so the copy never reaches stat.
  write_file(object("ctx", 12), bytes);
  s.reset();  // the directory's lock goes with the node
  s = start(config());
  ASSERT_TRUE(s);
  c = client(s->address());
  auto st = c->stat("ctx", deadline_in(10s));
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->size(), 1u);
  EXPECT_EQ((*st)[0].chunk, 10u);
}

// Rotation: objects sealed under key 1 stay readable after key 2 is added; the
// background pass moves them (and objects stored in clear before encryption was on)
// to key 2, keeping their versions and parts, after which key 1 can go.
TEST_F(AtRest, RotationReencryptsAndTheOldKeyCanGo) {
  const std::vector<ObjectPart> parts = {{1000, 0.5}, {kBlock + 7, 0.25}};
  {  // in clear first
    auto s = start(config(false));
    ASSERT_TRUE(s);
    ASSERT_TRUE(client(s->address())->put_versioned("clear", 0, 0, pattern(3000, 1), 77, deadline_in(10s)).ok());
  }
  EXPECT_EQ(format_and_key(object("clear", 0)).first, 3);
  auto s = start(config());
  ASSERT_TRUE(s);
  ASSERT_TRUE(settled(*s));
  EXPECT_EQ(format_and_key(object("clear", 0)), (std::pair<uint16_t, uint32_t>{4, 1}));
  EXPECT_EQ(s->counters().objects_reencrypted, 1u);
  auto c = client(s->address());
  for (uint32_t i = 0; i < 6; ++i)
    ASSERT_TRUE(c->put_parts("ctx", i, 0, pattern(kBlock + 7, i), parts, 100 + i, deadline_in(10s)).ok());
  keys_[2] = random_hex_key();
  write_keys();
  ASSERT_TRUE(s->reload_keys().ok());
  ASSERT_TRUE(c->put("ctx", 9, 0, pattern(500, 9), deadline_in(10s)).ok());
  EXPECT_EQ(format_and_key(object("ctx", 9)).second, 2u) << "a write after the reload";
  ASSERT_TRUE(settled(*s));
  for (uint32_t i = 0; i < 6; ++i) EXPECT_EQ(format_and_key(object("ctx", i)).second, 2u) << i;
  EXPECT_EQ(format_and_key(object("clear", 0)).second, 2u);
  EXPECT_EQ(s->counters().objects_reencrypted, 8u);
  // Key 1 retired: everything still reads, with its parts and versions.
  keys_.erase(1);
  write_keys();
  ASSERT_TRUE(s->reload_keys().ok());
  s.reset();  // the directory's lock goes with the node
  s = start(config());
  ASSERT_TRUE(s);
  c = client(s->address());
  for (uint32_t i = 0; i < 6; ++i) {
    auto got = fetch(*c, "ctx", i);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, pattern(kBlock + 7, i));
  }
  auto st = c->stat("ctx", deadline_in(10s));
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->size(), 7u);
  EXPECT_EQ((*st)[0].level_parts, (std::vector<std::vector<ObjectPart>>{parts}));
  EXPECT_EQ(c->put_versioned("ctx", 5, 0, pattern(10, 1), 105, deadline_in(10s)).code(), StatusCode::already_exists)
      << "the version was kept";
  EXPECT_EQ(c->put_versioned("clear", 0, 0, pattern(10, 1), 77, deadline_in(10s)).code(), StatusCode::already_exists);
  EXPECT_EQ(*fetch(*c, "clear", 0), pattern(3000, 1));
  EXPECT_TRUE(quarantine_empty());
}

// An object under a key the key file lacks is intact: indexed at start, refused with a
// message naming the key, never moved aside, and read again once the key is back.
TEST_F(AtRest, MissingKeyIsAClearErrorAndNotQuarantined) {
  const auto body = pattern(200000, 3);
  const std::string key1 = keys_[1];
  {
    auto s = start(config());
    ASSERT_TRUE(s);
    ASSERT_TRUE(client(s->address())->put("ctx", 0, 0, body, deadline_in(10s)).ok());
  }
  keys_ = {{2, random_hex_key()}};
  {
    auto s = start(config());
    ASSERT_TRUE(s);
    auto c = client(s->address());
    auto st = c->stat("ctx", deadline_in(10s));
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    EXPECT_EQ(st->size(), 1u);
    auto got = fetch(*c, "ctx", 0);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::permission_denied) << got.status().to_string();
    EXPECT_NE(got.status().message().find("sealed under key 1"), std::string::npos) << got.status().message();
    EXPECT_NE(got.status().message().find("key file lacks"), std::string::npos) << got.status().message();
    EXPECT_FALSE(fetch_range(*c, "ctx", 0, 10, 10).ok());
    std::this_thread::sleep_for(200ms);  // the background pass has looked at it too
    EXPECT_EQ(s->counters().objects_under_old_keys, 1u);
    EXPECT_EQ(s->counters().objects_reencrypted, 0u);
    // Without any key file, the node indexes it all the same.
    s.reset();
    s = start(config(false));
    ASSERT_TRUE(s);
    c = client(s->address());
    EXPECT_EQ(fetch(*c, "ctx", 0).status().code(), StatusCode::permission_denied);
  }
  EXPECT_TRUE(quarantine_empty());
  keys_[1] = key1;
  auto s = start(config());
  ASSERT_TRUE(s);
  auto got = fetch(*client(s->address()), "ctx", 0);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, body);
  ASSERT_TRUE(settled(*s));
  EXPECT_EQ(format_and_key(object("ctx", 0)).second, 2u);
}

// Ranges at and across block boundaries, of objects of odd sizes, read whole into the
// cache and streamed from disk, through the node; and ObjectFile::read directly at
// every offset pattern a range can take within a few blocks.
TEST_F(AtRest, RangesAcrossBlockBoundaries) {
  const std::vector<size_t> sizes = {1, kBlock - 1, kBlock, kBlock + 1, 5 * kBlock + 333, (3 << 20) + 1};
  for (const bool streamed : {false, true}) {
    SCOPED_TRACE(streamed ? "streamed" : "read whole");
    auto cfg = config();
    if (streamed) cfg.cache_bytes = 0;
    auto s = start(cfg);
    ASSERT_TRUE(s);
    auto c = client(s->address());
    const std::string ctx = streamed ? "s" : "w";
    for (uint32_t i = 0; i < sizes.size(); ++i) {
      const size_t n = sizes[i];
      const auto body = pattern(n, 50 + i);
      ASSERT_TRUE(c->put(ctx, i, 0, body, deadline_in(30s)).ok());
      std::vector<std::pair<uint64_t, uint64_t>> ranges = {{0, 1}, {n - 1, 1}, {0, n}};
      if (n > kBlock) ranges.insert(ranges.end(), {{kBlock - 1, 2}, {kBlock, n - kBlock}, {kBlock - 5, 10}});
      if (n > 3 * kBlock) ranges.insert(ranges.end(), {{kBlock + 1, 2 * kBlock}, {kBlock / 2, 3 * kBlock}});
      if (n > (2 << 20)) ranges.insert(ranges.end(), {{(1 << 20) - 3, (1 << 20) + 6}, {n - (1 << 20) - 1, 1 << 20}});
      for (const auto& [off, len] : ranges) {
        if (off + len > n) continue;  // the small objects
        auto got = fetch_range(*c, ctx, i, off, len);
        ASSERT_TRUE(got.ok()) << n << " [" << off << ", +" << len << "): " << got.status().to_string();
        ASSERT_TRUE(std::equal(got->begin(), got->end(), body.begin() + off)) << n << " [" << off << ", +" << len;
      }
    }
  }
  // The object file alone: every range that starts and ends at a boundary +-1 of a
  // 4-block object whose last block is short.
  auto ring = security::KeyRing::from_keys({{7, security::Key256{1, 2, 3}}});
  ASSERT_TRUE(ring.ok());
  TempDir other("kvstream-at-rest-file");
  MemoryBudget budget(64 << 20);
  auto store = ChunkStore::open(other.path().string(), 0, budget, *ring);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  const ObjectKey key{"t", "c", 0, 0};
  const size_t n = 3 * kBlock + 100;
  const auto body = pattern(n, 9);
  ASSERT_TRUE((*store)->put(key, body).ok());
  auto f = ObjectFile::open((other.path() / "t" / "c" / "c0.l0").string(), key.name(), ring->get());
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_TRUE(f->sealed());
  std::vector<uint64_t> marks = {0, 1, n - 1, n};
  for (uint64_t b = 1; b <= 3; ++b) marks.insert(marks.end(), {b * kBlock - 1, b * kBlock, b * kBlock + 1});
  for (uint64_t from : marks)
    for (uint64_t to : marks) {
      if (to <= from) continue;
      std::vector<std::byte> out(to - from);
      ASSERT_TRUE(f->read(from, out).ok()) << from << ".." << to;
      ASSERT_TRUE(std::equal(out.begin(), out.end(), body.begin() + from)) << from << ".." << to;
    }
  // An empty object, sealed: no blocks.
  ASSERT_TRUE((*store)->put({"t", "c", 1, 0}, {}).ok());
  auto empty = (*store)->read_all({"t", "c", 1, 0});
  ASSERT_TRUE(empty.ok()) << empty.status().to_string();
  EXPECT_TRUE(empty->empty());
  EXPECT_EQ(fs::file_size(other.path() / "t" / "c" / "c1.l0"), 80u);
}

// Blocks reordered within an object, swapped in from another object of the same
// tenant and key, or a payload cut at a block boundary (its header's length and binding
// rewritten to match) all fail: each block's nonce and associated data name its object
// and place, and the header's seal binds the length.
TEST_F(AtRest, MovedSwappedOrCutBlocksFail) {
  auto ring = security::KeyRing::from_keys({{1, security::Key256{9}}});
  ASSERT_TRUE(ring.ok());
  MemoryBudget budget(64 << 20);
  auto store = ChunkStore::open(dir_.string(), 0, budget, *ring);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  const size_t n = 3 * kBlock, stride = kBlock + 16, header = 80;
  for (uint32_t i = 0; i < 2; ++i) ASSERT_TRUE((*store)->put({"tenant-a", "ctx", i, 0}, pattern(n, i)).ok());
  const auto a = file_bytes(object("ctx", 0)), b = file_bytes(object("ctx", 1));
  auto read_as = [&](const std::vector<std::byte>& file) -> Status {
    write_file(dir_ / "probe", file);
    KVS_ASSIGN_OR_RETURN(auto f, ObjectFile::open((dir_ / "probe").string(), "tenant-a/ctx/c0.l0", ring->get()));
    std::vector<std::byte> out(f.size());
    return f.read(0, out);
  };
  ASSERT_TRUE(read_as(a).ok()) << "the unchanged file reads";
  {
    auto swapped = a;  // blocks 0 and 1 of the same object
    std::swap_ranges(swapped.begin() + header, swapped.begin() + header + stride, swapped.begin() + header + stride);
    EXPECT_EQ(read_as(swapped).code(), StatusCode::corrupt_data);
  }
  {
    auto foreign = a;  // block 1 of another object sealed under the same key
    std::copy(b.begin() + header + stride, b.begin() + header + 2 * stride, foreign.begin() + header + stride);
    EXPECT_EQ(read_as(foreign).code(), StatusCode::corrupt_data);
  }
  {
    auto cut = std::vector<std::byte>(a.begin(), a.end() - stride);  // the last block gone
    const uint64_t length = 2 * kBlock;
    std::memcpy(cut.data() + 8, &length, 8);
    std::vector<std::byte> bound(cut.begin(), cut.begin() + 72);
    for (char ch : std::string("tenant-a/ctx/c0.l0")) bound.push_back(std::byte(ch));
    const uint64_t binding = body_checksum(bound);
    std::memcpy(cut.data() + 72, &binding, 8);
    const Status s = read_as(cut);
    EXPECT_EQ(s.code(), StatusCode::corrupt_data) << s.to_string();
  }
}

// Objects larger than the cache and the node's whole memory budget stream encrypted,
// both ways, whole and in ranges.
TEST_F(AtRest, LargeObjectsStreamEncrypted) {
  auto cfg = config();
  cfg.cache_bytes = 1 << 20;
  cfg.memory_budget_bytes = 4 << 20;
  auto s = start(cfg);
  ASSERT_TRUE(s);
  auto c = client(s->address());
  const auto body = pattern((9 << 20) + 12345, 4);
  ASSERT_TRUE(c->put("big", 0, 0, body, deadline_in(60s)).ok());
  for (int i = 0; i < 2; ++i) {
    auto got = fetch(*c, "big", 0);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, body);
  }
  auto range = fetch_range(*c, "big", 0, (4 << 20) - 7, (3 << 20) + 11);
  ASSERT_TRUE(range.ok()) << range.status().to_string();
  EXPECT_TRUE(std::equal(range->begin(), range->end(), body.begin() + (4 << 20) - 7));
  EXPECT_FALSE(contains(file_bytes(object("big", 0)), std::span(body).subspan(5 << 20)));
  EXPECT_LE(s->counters().budget_peak_bytes, uint64_t(4) << 20);
}

// An object held when the store opened, behind the fence of a node returning to its
// cluster (docs/protocol.md, "Removes"), stays behind it when the pass rewrites it
// under the new key: the same write.
TEST_F(AtRest, AnObjectRewrittenUnderANewKeyStaysBehindTheFence) {
  auto one = security::KeyRing::from_keys({{1, security::Key256{1}}});
  auto both = security::KeyRing::from_keys({{1, security::Key256{1}}, {2, security::Key256{2}}});
  ASSERT_TRUE(one.ok() && both.ok());
  MemoryBudget budget(64 << 20);
  const ObjectKey k{"tenant-a", "ctx", 0, 0};
  {
    auto store = ChunkStore::open(dir_.string(), 8 << 20, budget, *one);
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    ASSERT_TRUE((*store)->put(k, pattern(5000, 1), 10).ok());
  }
  auto store = ChunkStore::open(dir_.string(), 8 << 20, budget, *both);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  (*store)->fence_held_at_open();
  auto r = (*store)->reencrypt({0, {}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->reencrypted, 1u);
  EXPECT_EQ((*store)->get(k).status().code(), StatusCode::not_found) << "the rewrite let it past the fence";
  (*store)->lift_fence();
  auto got = (*store)->read_all(k);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, pattern(5000, 1));
  EXPECT_TRUE((*store)->get(k).ok());
}

// Writes racing a re-encryption pass (the store alone): every object ends with its
// newest write, at its version; the pass never commits over a write it did not read.
TEST_F(AtRest, WritesDuringReencryptionLoseNothingNewer) {
  auto one = security::KeyRing::from_keys({{1, security::Key256{1}}});
  auto both = security::KeyRing::from_keys({{1, security::Key256{1}}, {2, security::Key256{2}}});
  ASSERT_TRUE(one.ok() && both.ok());
  MemoryBudget budget(64 << 20);
  auto store = ChunkStore::open(dir_.string(), 8 << 20, budget, *one);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  constexpr uint32_t kObjects = 120;
  std::vector<std::vector<std::byte>> latest(kObjects);
  std::vector<uint64_t> version(kObjects);
  for (uint32_t i = 0; i < kObjects; ++i) {
    latest[i] = pattern(kBlock + 1000 + i, i);
    version[i] = 10;
    ASSERT_TRUE((*store)->put({"tenant-a", "ctx", i, 0}, latest[i], version[i]).ok());
  }
  (*store)->set_keys(*both);
  EXPECT_EQ((*store)->objects_under_old_keys(), kObjects);
  std::atomic<bool> done{false};
  ReencryptReport report;
  std::thread pass([&] {
    // Paced so that the writes below overlap it: ~8 MiB over ~0.6 s.
    auto r = (*store)->reencrypt({14 << 20, {}});
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) report = *r;
    done = true;
  });
  // The writes start once the pass has listed its objects (its first one has moved):
  // an object written before that is under the new key already and never on the
  // pass's list, and the count below would miss it.
  while (!done && (*store)->objects_under_old_keys() == kObjects) std::this_thread::yield();
  std::mt19937 rng(5);
  int writes = 0;
  while (!done) {
    const uint32_t i = rng() % kObjects;
    auto body = pattern(500 + rng() % (2 * kBlock), uint32_t(1000 + writes));
    // Versioned and unversioned writes alike.
    const uint64_t v = writes % 2 ? version[i] + 1 : 0;
    ASSERT_TRUE((*store)->put({"tenant-a", "ctx", i, 0}, body, v).ok());
    version[i] = v ? v : version[i] + 1;
    latest[i] = std::move(body);
    ++writes;
  }
  pass.join();
  EXPECT_GT(writes, 20);
  EXPECT_GT(report.reencrypted, 0u);
  EXPECT_GT(report.replaced, 0u) << "no write overlapped the pass";
  EXPECT_EQ(report.failed, 0u);
  EXPECT_EQ(report.reencrypted + report.replaced, kObjects);
  for (uint32_t i = 0; i < kObjects; ++i) {
    auto got = (*store)->read_stored({"tenant-a", "ctx", i, 0});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->bytes, latest[i]) << "object " << i << " lost its newest write";
    ASSERT_EQ(got->version, version[i]) << i;
    EXPECT_EQ(format_and_key(object("ctx", i)).second, 2u) << i;
  }
  EXPECT_EQ((*store)->objects_under_old_keys(), 0u);
  EXPECT_TRUE(fs::is_empty(dir_ / ".tmp"));
}

// The offline tool (kvstream-server --reencrypt's pass): refuses a directory a node
// serves, then moves every object to the current key.
TEST_F(AtRest, OfflineReencryptionMovesEveryObject) {
  {
    auto s = start(config());
    ASSERT_TRUE(s);
    auto c = client(s->address());
    for (uint32_t i = 0; i < 5; ++i) ASSERT_TRUE(c->put("ctx", i, 0, pattern(70000, i), deadline_in(10s)).ok());
    keys_[3] = random_hex_key();
    write_keys();
    EXPECT_EQ(reencrypt_store(dir_.string(), {key_file_.string()}).status().code(), StatusCode::already_exists)
        << "a node holds the directory";
  }
  auto r = reencrypt_store(dir_.string(), {key_file_.string()});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->reencrypted, 5u);
  EXPECT_EQ(r->remaining, 0u);
  for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ(format_and_key(object("ctx", i)).second, 3u);
  EXPECT_EQ(reencrypt_store(dir_.string(), {}).status().code(), StatusCode::invalid_argument);
}

}  // namespace

}  // namespace kvstream::test_at_rest
